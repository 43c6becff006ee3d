package sealing

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
)

// Config is the "encryption" section of a service's config file:
//
//	"encryption": {
//	  "active_key_label": "2025-06",
//	  "keys": [
//	    {"label": "2025-06", "file": "/etc/gavel/keys/2025-06.key"},
//	    {"label": "2025-01", "file": "/etc/gavel/keys/2025-01.key"}
//	  ]
//	}
//
// Keys come from files only, never from flags: a command line is visible to every user of the
// host. The zero Config is encryption off.
type Config struct {
	// ActiveKeyLabel is the label of the key every new record is sealed under; records sealed
	// under another label (or clear) are re-encrypted under it in the background.
	ActiveKeyLabel string `json:"active_key_label,omitempty"`
	// Keys are every key that may open a stored record: the active one and the older ones still
	// in use. A key may be dropped once nothing is sealed under it
	// (gavel_bbs_records_to_reencrypt and gavel_nsync_records_to_reencrypt are zero).
	Keys []KeyFile `json:"keys,omitempty"`
}

// KeyFile names one key and the file holding it.
type KeyFile struct {
	// Label names the key; it is stored beside every value sealed under it (1 to 64 bytes).
	Label string `json:"label"`
	// File holds the key: 32 random bytes, base64-encoded (standard alphabet, padded), with
	// optional surrounding white space, as `gavel keys new FILE` writes it.
	File string `json:"file"`
}

// Enabled reports whether c turns encryption on.
func (c Config) Enabled() bool { return c.ActiveKeyLabel != "" || len(c.Keys) > 0 }

// Validate reports every problem of c's shape (labels, files named, active label present)
// without reading the key files; Keyring reads them.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	var errs []error
	seen := map[string]bool{}
	for i, k := range c.Keys {
		if err := checkLabel(k.Label); err != nil {
			errs = append(errs, fmt.Errorf("encryption.keys[%d]: %w", i, err))
		}
		if k.File == "" {
			errs = append(errs, fmt.Errorf("encryption.keys[%d] (label %q): file is required", i, k.Label))
		}
		if k.Label != "" && seen[k.Label] {
			errs = append(errs, fmt.Errorf("encryption.keys: label %q is given twice", k.Label))
		}
		seen[k.Label] = true
	}
	switch {
	case c.ActiveKeyLabel == "":
		errs = append(errs, errors.New("encryption.active_key_label is required with encryption.keys"))
	case !seen[c.ActiveKeyLabel]:
		errs = append(errs, fmt.Errorf("encryption.active_key_label %q has no key in encryption.keys", c.ActiveKeyLabel))
	}
	return errors.Join(errs...)
}

// Keyring validates c and reads its key files; nil (encryption off) when c is the zero
// Config. A missing, unreadable or malformed file is an error naming it.
func (c Config) Keyring() (*Keyring, error) {
	if !c.Enabled() {
		return nil, nil
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	keys := make(map[string]Key, len(c.Keys))
	var errs []error
	for _, kf := range c.Keys {
		k, err := ReadKeyFile(kf.File)
		if err != nil {
			errs = append(errs, fmt.Errorf("encryption key %q: %w", kf.Label, err))
			continue
		}
		keys[kf.Label] = k
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return NewKeyring(c.ActiveKeyLabel, keys)
}

// ReadKeyFile reads a key file: 32 bytes, base64-encoded, with optional surrounding white space.
func ReadKeyFile(path string) (Key, error) {
	var k Key
	b, err := os.ReadFile(path)
	if err != nil {
		return k, fmt.Errorf("read key file: %w", err)
	}
	raw, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil {
		return k, fmt.Errorf("key file %s: not base64 (write one with `gavel keys new`): %w", path, err)
	}
	if len(raw) != KeySize {
		return k, fmt.Errorf("key file %s: holds %d bytes, want %d (AES-256)", path, len(raw), KeySize)
	}
	copy(k[:], raw)
	return k, nil
}

// WriteKeyFile writes a fresh random key to path with mode 0600, base64-encoded on one line. It
// never replaces an existing file: overwriting a key in use would make its records unreadable.
func WriteKeyFile(path string) error {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return fmt.Errorf("new key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("new key file: %w", err)
	}
	_, werr := f.WriteString(base64.StdEncoding.EncodeToString(k[:]) + "\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(path)
		return fmt.Errorf("write key file %s: %w", path, werr)
	}
	return nil
}
