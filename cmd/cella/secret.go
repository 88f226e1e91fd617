package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/secrets"
)

func newSecretCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Manage secrets the egress proxy injects into sandbox traffic (E2B's /secrets API; admin key; values are never shown)",
	}
	var value, fromFile string
	var keepNewline bool
	var meta []string
	set := &cobra.Command{
		Use:   "set NAME",
		Short: "Create a secret or store a new value (version) of it: read from stdin, --from-file, or --value",
		Long: `Create a secret, or store a new value of an existing one (its version goes up
by one; only the newest value is kept).

NAME is 1-128 letters, digits, '_', '.' and '-'. Sandbox egress rules refer to
it as ${e2b.secrets.NAME} (or ${secret:NAME}).

The value is read from stdin unless --from-file or --value is given. Prefer
stdin or a file: a --value shows up in the shell history and the process list.
One trailing newline is removed from stdin and file input (--keep-newline keeps it).

--metadata replaces the secret's metadata (labels, stored in plaintext);
without it an existing secret keeps its metadata.`,
		Example: "  printf %s \"$TOKEN\" | cella secret set GH_TOKEN\n  cella secret set openai-api-key --from-file ~/.openai-key --metadata owner=ml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := secrets.ValidateName(args[0]); err != nil {
				return err
			}
			md, err := parseSecretMetadata(cmd, meta)
			if err != nil {
				return err
			}
			v, err := secretValue(cmd, value, fromFile, keepNewline)
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			s, err := c.SetSecret(cmd.Context(), args[0], v, md)
			if err != nil {
				return err
			}
			fmt.Printf("%s %s version %d\n", s.Name, s.SecretID, s.CurrentVersion)
			return nil
		},
	}
	set.Flags().StringVar(&value, "value", "", "the value (visible in shell history and ps: prefer stdin)")
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file")
	set.Flags().BoolVar(&keepNewline, "keep-newline", false, "keep a trailing newline of stdin or file input")
	set.Flags().StringArrayVar(&meta, "metadata", nil, "KEY=VALUE label (repeatable; replaces the stored metadata; plaintext, never credentials)")
	set.MarkFlagsMutuallyExclusive("value", "from-file")
	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List secrets (names, IDs, versions and times; never values)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			ss, err := c.Secrets(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if ss == nil {
					ss = []client.Secret{}
				}
				return printJSON(ss)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tID\tVERSION\tUPDATED")
			for _, s := range ss {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", s.Name, s.SecretID, s.CurrentVersion, s.UpdatedAt.Local().Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON (with metadata and creation times)")
	rm := newRmCmd("rm NAME|ID...", "Delete secrets, by name or ID", func(ctx context.Context, c *client.Client, n string) error {
		return c.DeleteSecret(ctx, n)
	})
	cmd.AddCommand(set, ls, rm)
	return cmd
}

// parseSecretMetadata turns --metadata KEY=VALUE flags into a map: nil
// when the flag is not given, so an update keeps the stored metadata.
func parseSecretMetadata(cmd *cobra.Command, kvs []string) (map[string]string, error) {
	if !cmd.Flags().Changed("metadata") {
		return nil, nil
	}
	md := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--metadata %q: want KEY=VALUE", kv)
		}
		md[k] = v
	}
	if err := secrets.ValidateMetadata(md); err != nil {
		return nil, fmt.Errorf("--metadata: %w", err)
	}
	return md, nil
}

// secretValue reads the value from the flag, the file or stdin. Nothing
// here prints it.
func secretValue(cmd *cobra.Command, value, fromFile string, keepNewline bool) (string, error) {
	if cmd.Flags().Changed("value") {
		if value == "" {
			return "", errors.New("--value is empty")
		}
		return value, nil
	}
	var data []byte
	var err error
	switch {
	case fromFile != "":
		data, err = readLimited(fromFile, nil)
	default:
		if f, ok := cmd.InOrStdin().(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			fmt.Fprintln(os.Stderr, "reading the value from stdin (end with Ctrl-D; it is not echoed back)")
		}
		data, err = readLimited("stdin", cmd.InOrStdin())
	}
	if err != nil {
		return "", err
	}
	v := string(data)
	if !keepNewline {
		v = strings.TrimSuffix(strings.TrimSuffix(v, "\n"), "\r")
	}
	if v == "" {
		return "", errors.New("the value is empty")
	}
	return v, nil
}

// readLimited reads at most one byte past the limit, so an oversized input
// fails here with a clear message instead of being sent in full.
func readLimited(name string, r io.Reader) ([]byte, error) {
	if r == nil {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--from-file: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, secrets.MaxValueBytes+2))
	if err != nil {
		return nil, fmt.Errorf("read the value from %s: %w", name, err)
	}
	if len(data) > secrets.MaxValueBytes+1 {
		return nil, fmt.Errorf("the value from %s is larger than %d bytes (64 KiB)", name, secrets.MaxValueBytes)
	}
	return data, nil
}
