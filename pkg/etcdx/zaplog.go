package etcdx

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newZapLogger returns a zap logger, as the etcd client requires, that
// forwards entries at error level and above to an hclog logger and drops the
// rest: the etcd client is chatty at lower levels.
func newZapLogger(logger hclog.Logger) *zap.Logger {
	return zap.New(&hclogCore{logger: logger, level: zapcore.ErrorLevel})
}

// hclogCore is a zapcore.Core writing to an hclog.Logger.
type hclogCore struct {
	logger hclog.Logger
	level  zapcore.Level
	fields []zapcore.Field
}

var _ zapcore.Core = (*hclogCore)(nil)

// Enabled reports whether entries at lvl are forwarded.
func (c *hclogCore) Enabled(lvl zapcore.Level) bool { return c.level.Enabled(lvl) }

// With returns a core that adds fields to every entry.
func (c *hclogCore) With(fields []zapcore.Field) zapcore.Core {
	return &hclogCore{
		logger: c.logger,
		level:  c.level,
		fields: append(slices.Clip(c.fields), fields...),
	}
}

// Check adds the core to ce when the entry's level is enabled.
func (c *hclogCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

// Write forwards one entry with its fields as hclog key/value pairs.
func (c *hclogCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	args := make([]any, 0, 2*len(keys)+2)
	if ent.LoggerName != "" {
		args = append(args, "zap_logger", ent.LoggerName)
	}
	for _, k := range keys {
		args = append(args, k, enc.Fields[k])
	}
	switch {
	case ent.Level >= zapcore.ErrorLevel:
		c.logger.Error(ent.Message, args...)
	case ent.Level == zapcore.WarnLevel:
		c.logger.Warn(ent.Message, args...)
	case ent.Level == zapcore.InfoLevel:
		c.logger.Info(ent.Message, args...)
	default:
		c.logger.Debug(ent.Message, args...)
	}
	return nil
}

// Sync is a no-op: hclog writes synchronously.
func (c *hclogCore) Sync() error { return nil }

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
