package main

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/client"
)

func newWaitCmd() *cobra.Command {
	var (
		port    int
		logRE   string
		pid     int
		timeout time.Duration
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "wait [flags] ID (--port N | --log REGEXP --pid P)",
		Short: "Wait until a port listens, or a process prints a matching line, in a sandbox",
		Long: `Block until something in the sandbox listens on a TCP port (--port), or until
process P prints an output line matching a regular expression (--log, --pid;
lines it printed before the wait count too). The agent inside the sandbox
watches; nothing sleeps. Exits 0 when ready, 124 on timeout, 1 when the
process ended without printing the line.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (port == 0) == (logRE == "") {
				return errors.New("give exactly one of --port or --log")
			}
			if logRE != "" && pid <= 0 {
				return errors.New("--log needs --pid (the pid printed when the process started)")
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			res, err := c.Wait(cmd.Context(), args[0], client.WaitRequest{Port: port, Log: logRE, PID: pid, Timeout: timeout.Seconds()})
			var ae *client.APIError
			if errors.As(err, &ae) && (ae.Status == http.StatusRequestTimeout || ae.Status == http.StatusConflict) {
				code := 124
				if ae.Status == http.StatusConflict {
					code = 1
				}
				if asJSON {
					_ = printJSON(map[string]any{"ready": false, "message": ae.Message})
					return &exitError{code: code}
				}
				return &exitError{code: code, msg: ae.Message}
			}
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(res)
			}
			elapsed := time.Duration(res.ElapsedMs) * time.Millisecond
			if port != 0 {
				fmt.Printf("port %d is listening (after %v)\n", port, elapsed)
			} else {
				fmt.Printf("process %d printed: %s (after %v)\n", pid, res.Line, elapsed)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&port, "port", 0, "wait until this TCP port listens")
	cmd.Flags().StringVar(&logRE, "log", "", "wait until process --pid prints a line matching this regular expression (RE2)")
	cmd.Flags().IntVar(&pid, "pid", 0, "the process whose output --log watches")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}
