package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

func newExposeCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "expose [flags] ID PORT",
		Short: "Print the preview URL of a port of a sandbox",
		Long: `Print the URL at which the daemon's proxy serves a port of a sandbox:
<scheme>://<port>-<id>.<domain>[:<daemon port>]. HTTP, streaming responses and
WebSockets pass through. Without wildcard DNS for the domain, the same proxy
answers on the daemon's own address when the request carries the Host header
(or E2B's E2b-Sandbox-Id / E2b-Sandbox-Port headers); cella prints that form
too. Nothing is opened: every port of a running sandbox is reachable this way.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil || port <= 0 || port > 65535 {
				return fmt.Errorf("invalid port %q", args[1])
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			e, err := c.Expose(cmd.Context(), args[0], port)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(e)
			}
			fmt.Println(e.URL)
			tok := ""
			if e.TrafficAccessToken != "" {
				tok = " -H 'e2b-traffic-access-token: " + e.TrafficAccessToken + "'"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := net.DefaultResolver.LookupHost(ctx, e.Host); err != nil {
				fmt.Printf("# %s has no DNS; without it, reach the port through the daemon:\n", e.Host)
				fmt.Printf("curl -H 'Host: %s'%s %s/\n", e.Host, tok, e.DaemonURL)
				fmt.Printf("curl -H 'E2b-Sandbox-Id: %s' -H 'E2b-Sandbox-Port: %d'%s %s/\n", e.SandboxID, port, tok, e.DaemonURL)
			} else if tok != "" {
				fmt.Printf("# this sandbox does not allow public traffic; send:%s\n", tok)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"url","host","daemonURL",...} as JSON`)
	return cmd
}
