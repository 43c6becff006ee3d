package etcdx

import (
	"slices"

	"github.com/hashicorp/go-hclog"
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
