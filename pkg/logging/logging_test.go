package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "zero value", cfg: Config{}},
		{name: "debug json", cfg: Config{Level: "debug", Format: "json"}},
		{name: "upper case", cfg: Config{Level: "WARN", Format: "TEXT"}},
		{name: "every level", cfg: Config{Level: "trace"}},
		{name: "bad level", cfg: Config{Level: "verbose"}, wantErr: `level "verbose"`},
		{name: "bad format", cfg: Config{Format: "yaml"}, wantErr: `format "yaml"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		logDebug  bool
		logInfo   bool
		checkJSON bool
	}{
		{name: "default info text", cfg: Config{}, logInfo: true},
		{name: "debug", cfg: Config{Level: "debug"}, logDebug: true, logInfo: true},
		{name: "error only", cfg: Config{Level: "error"}},
		{name: "json", cfg: Config{Format: "json"}, logInfo: true, checkJSON: true},
		{name: "invalid level falls back to info", cfg: Config{Level: "nope"}, logInfo: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tt.cfg.Output = &buf
			l := New("bbs", tt.cfg)
			l.Debug("debug line", "cell_id", "c1")
			l.Info("info line", "cell_id", "c1")
			out := buf.String()
			if got := strings.Contains(out, "debug line"); got != tt.logDebug {
				t.Errorf("debug written = %v, want %v; output:\n%s", got, tt.logDebug, out)
			}
			if got := strings.Contains(out, "info line"); got != tt.logInfo {
				t.Errorf("info written = %v, want %v; output:\n%s", got, tt.logInfo, out)
			}
			if tt.logInfo && !strings.Contains(out, "bbs") {
				t.Errorf("output lacks logger name: %s", out)
			}
			if tt.checkJSON {
				var entry map[string]any
				if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &entry); err != nil {
					t.Fatalf("output is not one JSON object: %v\n%s", err, out)
				}
				if entry["@message"] != "info line" || entry["cell_id"] != "c1" || entry["@module"] != "bbs" {
					t.Errorf("unexpected JSON entry: %v", entry)
				}
			}
		})
	}
}
