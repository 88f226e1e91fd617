package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func newCreateCmd() *cobra.Command {
	var f createFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its ID",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request()
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			if !asJSON {
				fmt.Println(sb.SandboxID)
				return nil
			}
			d, err := c.Get(cmd.Context(), sb.SandboxID)
			if err != nil {
				return err
			}
			os.Stdout.Write(append(json.RawMessage(d.Raw), '\n'))
			return nil
		},
	}
	f.register(cmd.Flags(), "timeout")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox's JSON record")
	return cmd
}
