package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/sandbox"
)

// parsePoolSizes adds TEMPLATE=N items (comma-separated) to into:
// `cella serve --pool`.
func parsePoolSizes(v string, into map[string]int) error {
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, n, ok := strings.Cut(item, "=")
		size, err := strconv.Atoi(strings.TrimSpace(n))
		if !ok || strings.TrimSpace(name) == "" || err != nil {
			return fmt.Errorf("%q: want TEMPLATE=N, e.g. base=2", item)
		}
		if size < 0 || size > sandbox.MaxPoolSize {
			return fmt.Errorf("%q: the size must be between 0 and %d", item, sandbox.MaxPoolSize)
		}
		into[strings.TrimSpace(name)] = size
	}
	return nil
}

func newPoolCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "Manage warm pools: sandboxes started ahead per template, handed out on create",
	}
	var size int
	set := &cobra.Command{
		Use:   "set TEMPLATE --size N",
		Short: "Set a template's warm-pool size (admin key; 0 removes the pool; kept across daemon restarts)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("size") {
				return fmt.Errorf("give the pool's size: --size N (0 removes the pool)")
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			p, err := c.SetPool(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			fmt.Printf("%s: size %d, ready %d\n", args[0], p.Size, p.Ready)
			return nil
		},
	}
	set.Flags().IntVar(&size, "size", 0, "how many ready sandboxes to keep")
	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List warm pools",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			ps, err := c.ListPools(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ps)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TEMPLATE\tSIZE\tREADY\tFILLING\tHANDED OUT\tMISSES\tLAST ERROR")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Template, p.Size, p.Ready, p.Filling, p.HandedOut, p.Misses, p.LastError)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(set, ls)
	return cmd
}
