package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/builds"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/template"
)

// `cella template ls` and `rm` speak of templates by the names users know
// — an API template's alias, a builtin's or an image template's name —
// which only the daemon knows (aliases and warm pools are its records), so
// they go through its API; --local reads the shared cache on the host
// instead, by cache names, without the daemon.

func newTemplateLsCmd(store func() (*template.Store, error)) *cobra.Command {
	var asJSON, local bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List templates by the names users know: source, size, layers and cache name (--local: the cache itself)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if local {
				return listLocalTemplates(store, asJSON)
			}
			_, list, err := daemonTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tID\tCACHE NAME\tSOURCE\tSIZE\tLAYERS\tSTATUS")
			for _, t := range list {
				name, id := userName(t), "-"
				if name != t.TemplateID {
					id = t.TemplateID
				}
				src := "-"
				if t.Source.Kind != "" {
					src = t.Source.Description
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, id, orDash(t.StoreName), src, sizeOrDash(t.SizeBytes), countOrDash(t.LayerCount), t.BuildStatus)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON (the daemon's GET /templates; with --local the cache's records, lower dirs included)")
	ls.Flags().BoolVar(&local, "local", false, "list the template cache on this host by cache names, without the daemon")
	return ls
}

// daemonTemplates is the daemon's GET /templates, with the client.
func daemonTemplates(ctx context.Context) (*client.Client, []client.Template, error) {
	c, err := newClient()
	if err != nil {
		return nil, nil, err
	}
	list, err := c.ListTemplates(ctx)
	var ae *client.APIError
	if err != nil && !errors.As(err, &ae) {
		err = fmt.Errorf("%w (--local works on this host's template cache without the daemon)", err)
	}
	return c, list, err
}

// userName is how users name a template: an API template's alias, a
// machine template's name.
func userName(t client.Template) string {
	if len(t.Aliases) > 0 && t.Aliases[0] != "" {
		return t.Aliases[0]
	}
	return t.TemplateID
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func countOrDash(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func sizeOrDash(n int64) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

func listLocalTemplates(store func() (*template.Store, error), asJSON bool) error {
	s, err := store()
	if err != nil {
		return err
	}
	list, err := s.List()
	if err != nil {
		return err
	}
	if asJSON {
		type row struct {
			*template.Template
			Source string   `json:"source"`
			Lowers []string `json:"lowers"`
		}
		rows := []row{}
		for _, t := range list {
			rows = append(rows, row{t, t.Describe(), t.Lowers()})
		}
		return printJSON(rows)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tDIGEST\tSIZE\tLAYERS\tUSER\tCREATED")
	for _, t := range list {
		digest := "-"
		if t.Digest != "" {
			digest = strings.TrimPrefix(t.Digest, "sha256:")[:12]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", t.Name, t.Describe(), digest, sizeOrDash(t.Size), len(t.Lowers()), t.User, t.Created.Format("2006-01-02 15:04"))
	}
	return tw.Flush()
}

func newTemplateRmCmd(store func() (*template.Store, error)) *cobra.Command {
	var local bool
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove templates by alias, name, ID or cache name (refused while a sandbox or a warm pool uses them)",
		Long: `Remove templates through the daemon: NAME is an API template's alias or ID
(all its builds go), one of this machine's templates (a builtin, an image,
a cella template build; admin key), or a name in the CACHE NAME column of
cella template ls. A template a running or paused sandbox (of any daemon
sharing the cache) or a warm pool of the daemon uses is refused, naming
them. Layers no template uses are garbage-collected.

--local removes cache names on this host without the daemon (sandboxes
are still checked; warm pools and API templates are the daemon's).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if local {
				return removeLocalTemplates(store, args)
			}
			c, list, err := daemonTemplates(cmd.Context())
			if err != nil {
				return err
			}
			var errs []error
			for _, name := range args {
				i := slices.IndexFunc(list, func(t client.Template) bool {
					return t.TemplateID == name || t.StoreName == name || slices.Contains(t.Aliases, name) || slices.Contains(t.Names, name)
				})
				if i < 0 {
					errs = append(errs, fmt.Errorf("template %q not found (cella template ls lists them)", name))
					continue
				}
				if err := c.DeleteTemplate(cmd.Context(), list[i].TemplateID); err != nil {
					errs = append(errs, fmt.Errorf("remove template %q: %w", name, err))
					continue
				}
				fmt.Println(name)
			}
			return errors.Join(errs...)
		},
	}
	rm.Flags().BoolVar(&local, "local", false, "remove cache names on this host, without the daemon")
	return rm
}

func removeLocalTemplates(store func() (*template.Store, error), names []string) error {
	s, err := store()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if builds.IsStoreName(name) {
			errs = append(errs, fmt.Errorf("%s is the cache name of a build of an API template: remove the template through the daemon (cella template rm without --local), which keeps its records", name))
			continue
		}
		if err := s.Delete(name); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Println(name)
	}
	return errors.Join(errs...)
}
