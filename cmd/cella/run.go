package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

func newRunCmd() *cobra.Command {
	var cf createFlags
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARGS...]",
		Short: "Create a sandbox, run one command in it and remove it (like docker run --rm)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := cf.request()
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()

			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer signal.Stop(sigs)
			var got os.Signal
			go func() {
				select {
				case got = <-sigs:
					cancel()
				case <-ctx.Done():
				}
			}()

			sb, err := c.Create(ctx, req)
			if err != nil {
				return err
			}
			// The sandbox goes whatever happens to the command or to us.
			defer func() {
				kctx, kcancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer kcancel()
				if err := c.Kill(kctx, sb.SandboxID); err != nil {
					fmt.Fprintf(os.Stderr, "cella: remove sandbox %s: %v\n", sb.SandboxID, err)
				}
			}()
			err = runExec(ctx, c, sb.SandboxID, args, ef)
			if ctx.Err() != nil && got != nil {
				return &exitError{code: 130, msg: fmt.Sprintf("interrupted (%v): removing sandbox %s", got, sb.SandboxID)}
			}
			return err
		},
	}
	cf.register(cmd.Flags(), "sandbox-timeout")
	ef.register(cmd.Flags(), false)
	return cmd
}
