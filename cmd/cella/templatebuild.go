package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/build/dockerfile"
	"github.com/cella-sandbox/cella/internal/client"
)

// stepFlags are `cella template build`'s flags that make a build of
// steps, run by the daemon (each step in a sandbox): a Dockerfile, or
// --run commands on an image or template.
type stepFlags struct {
	dockerfile, contextDir string
	buildArgs, runs        []string
	fromTemplate           string
	startCmd, readyCmd     string
	noCache                bool
}

func (f *stepFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVarP(&f.dockerfile, "file", "f", "", "build from this Dockerfile (each instruction a step in a sandbox, run by the daemon)")
	fs.StringVar(&f.contextDir, "context", "", "the build context of COPY/ADD (default: the Dockerfile's directory)")
	fs.StringArrayVar(&f.buildArgs, "build-arg", nil, "K=V: a Dockerfile ARG's value (repeatable)")
	fs.StringArrayVar(&f.runs, "run", nil, "a RUN step on the --from-image or --from-template base (repeatable, in order)")
	fs.StringVar(&f.fromTemplate, "from-template", "", "with --run: start from this template (default: base)")
	fs.StringVar(&f.startCmd, "start-cmd", "", "with --run: a start command captured running in the template's snapshot")
	fs.StringVar(&f.readyCmd, "ready-cmd", "", "with --start-cmd: retried every 2 s until it exits 0 (default: sleep 20)")
	fs.BoolVar(&f.noCache, "no-cache", false, "rebuild every step (E2B's skipCache)")
}

// wanted says whether the flags ask for a daemon build.
func (f *stepFlags) wanted() bool {
	return f.dockerfile != "" || len(f.runs) > 0 || f.fromTemplate != "" || f.startCmd != ""
}

// run builds name through the daemon's E2B build API.
func (f *stepFlags) run(ctx context.Context, name, fromImage string, stderr io.Writer) error {
	c, err := newClient()
	if err != nil {
		return err
	}
	tb := &client.TemplateBuilds{C: c, Log: func(e build.LogEntry) {
		if e.Level != build.LevelDebug {
			fmt.Fprintln(stderr, e.Message)
		}
	}}
	if f.dockerfile == "" {
		spec := build.Spec{Name: name, Base: build.Base{Image: fromImage, Template: f.fromTemplate}, Force: f.noCache,
			StartCmd: f.startCmd, ReadyCmd: f.readyCmd}
		if spec.Base.Image == "" && spec.Base.Template == "" {
			spec.Base.Template = "base"
		}
		for _, r := range f.runs {
			spec.Steps = append(spec.Steps, build.Step{Type: build.StepRun, Args: []string{r}})
		}
		return tb.Build(ctx, spec, nil)
	}
	if fromImage != "" || len(f.runs) > 0 || f.fromTemplate != "" {
		return errors.New("-f takes its base and steps from the Dockerfile: drop --from-image, --from-template and --run")
	}
	args, err := parseKV(f.buildArgs, "--build-arg")
	if err != nil {
		return err
	}
	df, err := os.Open(f.dockerfile)
	if err != nil {
		return err
	}
	defer df.Close()
	plan, err := dockerfile.Parse(df, dockerfile.Options{Name: name, BuildArgs: args, Log: func(s string) { fmt.Fprintln(stderr, s) }})
	if err != nil {
		return err
	}
	ctxDir := f.contextDir
	if ctxDir == "" {
		ctxDir = filepath.Dir(f.dockerfile)
	}
	if f.noCache {
		for i := range plan.Stages {
			plan.Stages[i].Spec.Force = true
		}
	}
	return plan.Run(ctx, tb, ctxDir)
}
