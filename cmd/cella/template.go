package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/template"
)

func newTemplateCmd() *cobra.Command {
	var cacheDir string
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Build, import and list templates (root filesystems sandboxes start from)",
	}
	cmd.PersistentFlags().StringVar(&cacheDir, "cache-dir", envOr("CELLA_CACHE_DIR", "/var/cache/cella"), "template cache [CELLA_CACHE_DIR]")
	store := func() (*template.Store, error) { return template.NewStore(cacheDir) }

	var suite, packages, mirror string
	build := &cobra.Command{
		Use:   "build NAME --debootstrap SUITE --packages a,b,c",
		Short: "Build a template from Debian packages (cached by recipe)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			r := template.Recipe{Suite: suite, Mirror: mirror}
			for _, p := range strings.Split(packages, ",") {
				if p = strings.TrimSpace(p); p != "" {
					r.Packages = append(r.Packages, p)
				}
			}
			t, err := s.Build(cmd.Context(), args[0], r, os.Stderr)
			if err != nil {
				return err
			}
			fmt.Printf("template %s ready: %s\n", t.Name, t.RootFS)
			return nil
		},
	}
	build.Flags().StringVar(&suite, "debootstrap", "bookworm", "Debian suite to bootstrap")
	build.Flags().StringVar(&packages, "packages", "", "comma-separated Debian packages to install")
	build.Flags().StringVar(&mirror, "mirror", envOr("CELLA_DEBIAN_MIRROR", ""), "Debian mirror URL [CELLA_DEBIAN_MIRROR]")

	imp := &cobra.Command{
		Use:   "import NAME DIR",
		Short: "Adopt a root filesystem directory as a template",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			t, err := s.Import(args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Printf("template %s ready: %s\n", t.Name, t.RootFS)
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			list, err := s.List()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tUSER\tCREATED\tROOTFS")
			for _, t := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, t.User, t.Created.Format("2006-01-02 15:04"), t.RootFS)
			}
			return tw.Flush()
		},
	}
	ensure := &cobra.Command{
		Use:     "ensure [NAME...]",
		Aliases: []string{"ensure-base"},
		Short:   "Build builtin templates (base, code-interpreter-v1) this machine does not have yet (default: base)",
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			if len(args) == 0 {
				args = []string{"base"}
			}
			for _, name := range args {
				t, err := s.EnsureNamed(cmd.Context(), name, os.Stderr)
				if err != nil {
					return err
				}
				fmt.Printf("template %s ready: %s\n", t.Name, t.RootFS)
			}
			return nil
		},
	}
	cmd.AddCommand(build, imp, ls, ensure)
	return cmd
}
