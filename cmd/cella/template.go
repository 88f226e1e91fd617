package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/image"
	"github.com/cella-sandbox/cella/internal/template"
)

func newTemplateCmd() *cobra.Command {
	var (
		cacheDir string
		hosts    image.Hosts
		maxLayer int64
	)
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Build, pull, push, import, list and remove templates (the layers sandboxes start from)",
	}
	// The cache and registry settings of cella serve (serveconfig.go).
	set := register(cmd.PersistentFlags(), append([]*setting{cacheDirSetting(&cacheDir)}, registrySettings(&hosts, &maxLayer)...)...)
	store := func() (*template.Store, error) {
		if err := set.resolve(); err != nil {
			return nil, err
		}
		s, err := template.NewStore(cacheDir)
		if err != nil {
			return nil, err
		}
		s.Registry, s.Layers.MaxLayerSize = hosts, maxLayer
		return s, nil
	}

	var suite, packages, mirror, fromImage, auth string
	var steps stepFlags // templatebuild.go
	build := &cobra.Command{
		Use:   "build NAME (-f Dockerfile [--context DIR] | [--from-image REF | --from-template T] --run CMD... | --from-image REF | --debootstrap SUITE --packages a,b,c)",
		Short: "Build a template from an OCI image (registry, docker-archive:, oci-archive:, oci:) or from Debian packages",
		Long: `Build a template.

--from-image REF pulls an OCI image: REF is a registry reference
(registry.example:5000/team/img:tag, img@sha256:..., python:3.12-slim for
Docker Hub or its --registry-mirror), docker-archive:PATH.tar (what
docker save writes), oci-archive:PATH.tar or oci:DIR (an OCI layout).
Layers are unpacked once each into the shared layer store; the template
gets a user account (uid 1000) unless the image has one, and the image's
Env, WorkingDir and User as its defaults.

-f Dockerfile (or --run steps) has the daemon build the template: each
step in a gVisor sandbox, cached per step, through E2B's build API.

Without --from-image, debootstrap builds SUITE with --packages (cached by
recipe).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if steps.wanted() {
				if err := steps.run(cmd.Context(), args[0], fromImage, os.Stderr); err != nil {
					return err
				}
				fmt.Printf("template %s ready\n", args[0])
				return nil
			}
			s, err := store()
			if err != nil {
				return err
			}
			if fromImage != "" {
				a, err := registryAuth(auth)
				if err != nil {
					return err
				}
				t, err := s.Pull(cmd.Context(), args[0], fromImage, template.PullOptions{Auth: a, Progress: template.ProgressPrinter(os.Stderr)})
				if err != nil {
					return err
				}
				fmt.Printf("template %s ready: %s (%d layers)\n", t.Name, t.Ref, len(t.Lowers()))
				return nil
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
	build.Flags().StringVar(&fromImage, "from-image", "", "build from this OCI image instead of Debian packages")
	steps.register(build)
	build.Flags().StringVar(&auth, "registry-auth", "", "USER[:PASSWORD] for the image's registry; without :PASSWORD it is read from stdin (default: ~/.docker/config.json) [CELLA_REGISTRY_AUTH]")
	build.Flags().StringVar(&suite, "debootstrap", "bookworm", "Debian suite to bootstrap")
	build.Flags().StringVar(&packages, "packages", "", "comma-separated Debian packages to install")
	build.Flags().StringVar(&mirror, "mirror", envOr("CELLA_DEBIAN_MIRROR", ""), "Debian mirror URL [CELLA_DEBIAN_MIRROR]")

	var pushAuth string
	push := &cobra.Command{
		Use:   "push NAME REF",
		Short: "Push a template to a registry as an OCI image (one layer per template layer)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			a, err := registryAuth(pushAuth)
			if err != nil {
				return err
			}
			updates := make(chan v1.Update, 16)
			done := make(chan struct{})
			go func() {
				defer close(done)
				printed := int64(-1)
				for u := range updates {
					// A line per 10% at most.
					if u.Total > 0 && (u.Complete == u.Total || u.Complete*10/u.Total != printed) {
						printed = u.Complete * 10 / u.Total
						fmt.Fprintf(os.Stderr, "pushed %d / %d MiB\n", u.Complete>>20, u.Total>>20)
					}
				}
			}()
			ref, err := s.Push(cmd.Context(), args[0], args[1], template.PullOptions{Auth: a}, updates)
			<-done
			if err != nil {
				return err
			}
			fmt.Println(ref)
			return nil
		},
	}
	push.Flags().StringVar(&pushAuth, "registry-auth", "", "USER[:PASSWORD] for the registry (default: ~/.docker/config.json) [CELLA_REGISTRY_AUTH]")

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
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List templates: source, digest, size and layers",
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
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSOURCE\tDIGEST\tSIZE\tLAYERS\tUSER\tCREATED")
			for _, t := range list {
				digest, size := "-", "-"
				if t.Digest != "" {
					digest = strings.TrimPrefix(t.Digest, "sha256:")[:12]
				}
				if t.Size > 0 {
					size = fmt.Sprintf("%d MiB", t.Size>>20)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", t.Name, t.Describe(), digest, size, len(t.Lowers()), t.User, t.Created.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON (layers and lower dirs included)")
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove templates (refused while sandboxes use them); layers no template uses are garbage-collected",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store()
			if err != nil {
				return err
			}
			var errs []error
			for _, name := range args {
				if err := s.Delete(name); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Println(name)
			}
			return errors.Join(errs...)
		},
	}
	ensure := &cobra.Command{
		Use:     "ensure [NAME...]",
		Aliases: []string{"ensure-base"},
		Short:   "Build builtin templates (base, code-interpreter-v1, desktop, docker) this machine does not have yet (default: base)",
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
	cmd.AddCommand(build, push, imp, ls, rm, ensure)
	return cmd
}
