package main

import (
	"bytes"
	"encoding/json"
	"os"

	"github.com/spf13/cobra"
)

func newInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info ID",
		Short: "Show a sandbox's record as JSON (state, limits, network, expiry)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			d, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			if err := json.Indent(&buf, d.Raw, "", "  "); err != nil {
				return err
			}
			buf.WriteByte('\n')
			_, err = os.Stdout.Write(buf.Bytes())
			return err
		},
	}
}
