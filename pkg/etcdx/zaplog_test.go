package etcdx

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap"
)

func TestZapLoggerForwardsErrorsOnly(t *testing.T) {
	tests := []struct {
		name    string
		log     func(*zap.Logger)
		want    []string // substrings of the output; nil: no output
		wantNot []string
	}{
		{
			name: "error with fields",
			log: func(l *zap.Logger) {
				l.With(zap.String("endpoint", "http://e:2379")).Error("dial failed", zap.Error(errors.New("refused")))
			},
			want: []string{"[ERROR]", "dial failed", "endpoint=http://e:2379", "error=refused"},
		},
		{
			name: "named logger",
			log:  func(l *zap.Logger) { l.Named("watch").Error("lost") },
			want: []string{"lost", "zap_logger=watch"},
		},
		{
			name: "info dropped",
			log:  func(l *zap.Logger) { l.Info("chatty"); l.Warn("chattier") },
		},
		{
			name:    "parent fields unchanged by child",
			log:     func(l *zap.Logger) { p := l.With(zap.Int("a", 1)); _ = p.With(zap.Int("b", 2)); p.Error("m") },
			want:    []string{"a=1"},
			wantNot: []string{"b=2"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			logger := hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Trace})
			tt.log(newZapLogger(logger))
			out := buf.String()
			if tt.want == nil && out != "" {
				t.Fatalf("output = %q, want none", out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output %q does not contain %q", out, w)
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(out, w) {
					t.Errorf("output %q contains %q", out, w)
				}
			}
		})
	}
}
