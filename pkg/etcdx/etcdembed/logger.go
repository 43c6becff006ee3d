package etcdembed

import (
	"fmt"
	"sync/atomic"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newServerLogger builds the embedded etcd server's logger: etcd's default
// JSON-to-stderr logger at level, except that once closing is set errors are
// logged as warnings. Closing a server makes every serving goroutine report
// its closed listener as an error; that is shutdown, not failure.
func newServerLogger(level zapcore.Level, closing *atomic.Bool) (*zap.Logger, error) {
	lcfg := logutil.DefaultZapLoggerConfig
	lcfg.Level = zap.NewAtomicLevelAt(level)
	lg, err := lcfg.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return &shutdownCore{Core: c, closing: closing}
	}))
	if err != nil {
		return nil, fmt.Errorf("build etcd server logger: %w", err)
	}
	return lg, nil
}

// shutdownCore downgrades errors to warnings once closing is set.
type shutdownCore struct {
	zapcore.Core
	closing *atomic.Bool
}

// With returns a shutdownCore around the wrapped core's With.
func (c *shutdownCore) With(fields []zapcore.Field) zapcore.Core {
	return &shutdownCore{Core: c.Core.With(fields), closing: c.closing}
}

// Check passes the entry, downgraded if closing, to the wrapped core.
func (c *shutdownCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if ent.Level == zapcore.ErrorLevel && c.closing.Load() {
		ent.Level = zapcore.WarnLevel
	}
	return c.Core.Check(ent, ce)
}
