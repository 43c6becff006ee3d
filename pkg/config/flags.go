package config

import (
	"flag"

	"github.com/gavel-sched/gavel/pkg/logging"
	"github.com/gavel-sched/gavel/pkg/tlsx"
)

// TLSFlags binds -<prefix>-cert, -<prefix>-key and -<prefix>-ca to t, and the plaintext switch
// -<insecure> to t.Insecure; who names the other side in the help texts ("server", "BBS", …).
func TLSFlags(fs *flag.FlagSet, t *tlsx.Config, prefix, insecure, who string) {
	fs.StringVar(&t.CertFile, prefix+"-cert", t.CertFile, who+" TLS: certificate (PEM)")
	fs.StringVar(&t.KeyFile, prefix+"-key", t.KeyFile, who+" TLS: key (PEM)")
	fs.StringVar(&t.CAFile, prefix+"-ca", t.CAFile, who+" TLS: CA the peer's certificate must chain to (PEM)")
	fs.BoolVar(&t.Insecure, insecure, t.Insecure, who+": plaintext instead of TLS (development only)")
}

// LogFlags binds -log-level and -log-format to c.
func LogFlags(fs *flag.FlagSet, c *logging.Config) {
	fs.StringVar(&c.Level, "log-level", c.Level, "trace|debug|info|warn|error")
	fs.StringVar(&c.Format, "log-format", c.Format, "text|json")
}
