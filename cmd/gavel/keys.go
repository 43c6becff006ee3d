package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gavel-sched/gavel/pkg/sealing"
)

// keysCommand is `gavel keys`: encryption keys for records at rest.
func (c *cli) keysCommand() *cobra.Command {
	keys := &cobra.Command{
		Use:   "keys",
		Short: "Make encryption keys for records at rest (the BBS's and nsync's encryption section)",
	}
	keys.AddCommand(&cobra.Command{
		Use:   "new FILE",
		Short: "Write a fresh random AES-256 key to FILE (mode 0600; an existing file is never replaced)",
		Long: `new writes 32 random bytes, base64-encoded on one line, to FILE with mode 0600. It refuses
to replace an existing file: a key overwritten while records are sealed under it makes them
unreadable. Name the file in the services' config under a new label, e.g.

  "encryption": {"active_key_label": "2025-06",
                 "keys": [{"label": "2025-06", "file": "/etc/gavel/keys/2025-06.key"}]}

and see docs/operations.md, "Encryption keys and rotation", to rotate.`,
		Example: "  gavel keys new /etc/gavel/keys/2025-06.key",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sealing.WriteKeyFile(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(c.out, "wrote a new key to %s\n", args[0])
			return nil
		},
	})
	return keys
}
