package sealing

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testKeyring(t *testing.T, active string, labels ...string) *Keyring {
	t.Helper()
	keys := map[string]Key{}
	for i, l := range labels {
		var k Key
		k[0] = byte(i + 1)
		keys[l] = k
	}
	kr, err := NewKeyring(active, keys)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func TestSealOpen(t *testing.T) {
	old := testKeyring(t, "old", "old")
	both := testKeyring(t, "new", "old", "new")
	secret := []byte("DB_PASSWORD=hunter2")
	sealedOld, err := old.Seal("/k", secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealedOld, secret) {
		t.Fatal("sealed value contains the plaintext")
	}
	tampered := bytes.Clone(sealedOld)
	tampered[len(tampered)-1] ^= 1
	relabelled := bytes.Clone(sealedOld)
	copy(relabelled[3:], "new")
	for _, tc := range []struct {
		name      string
		kr        *Keyring
		context   string
		value     []byte
		want      []byte
		wantLabel string
		wantErr   string
	}{
		{"clear value passes through", both, "/k", []byte("\x0aclear"), []byte("\x0aclear"), "", ""},
		{"empty value is clear", nil, "/k", nil, nil, "", ""},
		{"old label opens with both keys", both, "/k", sealedOld, secret, "old", ""},
		{"old label opens with its key", old, "/k", sealedOld, secret, "old", ""},
		{"moved to another etcd key", both, "/other", sealedOld, nil, "old", "corrupt"},
		{"tampered ciphertext", both, "/k", tampered, nil, "old", "corrupt"},
		{"relabelled", both, "/k", relabelled, nil, "new", "corrupt"},
		{"label the keyring lacks", testKeyring(t, "x", "x"), "/k", sealedOld, nil, "old", `key label "old"`},
		{"sealed value with encryption off", nil, "/k", sealedOld, nil, "old", `key label "old"`},
		{"unknown envelope version", both, "/k", []byte{0, 9, 1, 'a'}, nil, "", "envelope version"},
		{"truncated label", both, "/k", []byte{0, 1, 5, 'a'}, nil, "", "truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, label, err := tc.kr.Open(tc.context, tc.value)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) || label != tc.wantLabel {
				t.Fatalf("Open = %q, %q, %v; want %q, %q", got, label, err, tc.want, tc.wantLabel)
			}
		})
	}
	var unknown *UnknownKeyError
	if _, _, err := (*Keyring)(nil).Open("/k", sealedOld); !errors.As(err, &unknown) || unknown.Label != "old" {
		t.Fatalf("err %v, want an UnknownKeyError naming old", err)
	}
}

func TestSealUnderActive(t *testing.T) {
	kr := testKeyring(t, "new", "old", "new")
	v, err := kr.Seal("/k", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	label, sealed, err := LabelOf(v)
	if err != nil || !sealed || label != "new" {
		t.Fatalf("LabelOf = %q %v %v", label, sealed, err)
	}
	v2, _ := kr.Seal("/k", []byte("x"))
	if bytes.Equal(v, v2) {
		t.Fatal("two seals of one plaintext are equal: nonce reused")
	}
	for _, tc := range []struct {
		label string
		want  bool
	}{{"new", false}, {"old", true}, {"", true}} {
		if got := kr.NeedsReseal(tc.label); got != tc.want {
			t.Errorf("NeedsReseal(%q) = %v", tc.label, got)
		}
	}
	if (*Keyring)(nil).NeedsReseal("") {
		t.Error("encryption off wants clear values resealed")
	}
	if got, _ := (*Keyring)(nil).Seal("/k", []byte("x")); string(got) != "x" {
		t.Errorf("nil keyring sealed: %q", got)
	}
}

func TestConfigKeyring(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.key")
	if err := WriteKeyFile(good); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte(base64.StdEncoding.EncodeToString(make([]byte, 16))), 0o600); err != nil {
		t.Fatal(err)
	}
	notB64 := filepath.Join(dir, "raw.key")
	if err := os.WriteFile(notB64, bytes.Repeat([]byte{0xff}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(dir, "unreadable.key")
	if err := os.Mkdir(unreadable, 0o700); err != nil { // a directory cannot be read as a file
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.key")
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr []string // each must appear; none: valid
		off     bool
	}{
		{"off", Config{}, nil, true},
		{"one key", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", good}}}, nil, false},
		{"missing file", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", missing}}}, []string{`"a"`, missing}, false},
		{"unreadable file", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", unreadable}}}, []string{`"a"`, unreadable}, false},
		{"wrong length", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", short}}}, []string{short, "16 bytes, want 32"}, false},
		{"not base64", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", notB64}}}, []string{notB64, "base64"}, false},
		{"duplicate label", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", good}, {"a", good}}}, []string{`label "a" is given twice`}, false},
		{"active without key", Config{ActiveKeyLabel: "b", Keys: []KeyFile{{"a", good}}}, []string{`active_key_label "b" has no key`}, false},
		{"keys without active", Config{Keys: []KeyFile{{"a", good}}}, []string{"active_key_label is required"}, false},
		{"empty label", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", good}, {"", good}}}, []string{"keys[1]: key label is empty"}, false},
		{"label too long", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", good}, {strings.Repeat("x", 65), good}}}, []string{"longer than 64"}, false},
		{"no file", Config{ActiveKeyLabel: "a", Keys: []KeyFile{{"a", ""}}}, []string{`(label "a"): file is required`}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kr, err := tc.cfg.Keyring()
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Keyring: %v", err)
				}
				if (kr == nil) != tc.off {
					t.Fatalf("keyring %v, want off=%v", kr, tc.off)
				}
				return
			}
			if err == nil {
				t.Fatal("Keyring accepted a bad config")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

func TestWriteKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.key")
	if err := WriteKeyFile(path); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", st.Mode(), err)
	}
	k1, err := ReadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if k1 == (Key{}) {
		t.Fatal("key is all zeros")
	}
	if err := WriteKeyFile(path); err == nil {
		t.Fatal("WriteKeyFile replaced an existing key")
	}
	if k2, _ := ReadKeyFile(path); k2 != k1 {
		t.Fatal("the existing key changed")
	}
}
