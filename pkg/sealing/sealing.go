// Package sealing encrypts records at rest: AES-256-GCM under labelled keys, with the label
// stored beside the ciphertext so that a keyring holding several keys opens what any of them
// sealed, and an active key that seals everything new. The BBS and nsync seal the records that
// carry user data with it (see docs/decisions/0020-encryption-at-rest.md).
//
// A sealed value is an envelope:
//
//	0x00                 magic: no protobuf encoding starts with a zero byte (field 0 is invalid)
//	0x01                 envelope version
//	n (1 byte)           length of the key label, 1..MaxLabelLen
//	label (n bytes)      the key's label
//	nonce (12 bytes)     random, one per seal
//	ciphertext || tag    AES-256-GCM of the plaintext, 16-byte tag
//
// The additional authenticated data is the envelope's header (magic through label) followed by
// the context the caller passes, the record's etcd key: a sealed value moved under another key,
// or relabelled, fails to open. Any other value (empty, or not starting with 0x00) is clear: a
// record written before encryption was on, returned as it is.
package sealing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"sort"
)

// KeySize is the length of a key: AES-256.
const KeySize = 32

// MaxLabelLen bounds a key label's length (it is stored in one byte of every envelope).
const MaxLabelLen = 64

const (
	magic     = 0x00
	version1  = 0x01
	nonceSize = 12
	// headerMin is magic, version and label length.
	headerMin = 3
)

// Key is one AES-256 key.
type Key [KeySize]byte

// UnknownKeyError is a sealed value whose key label the keyring lacks.
type UnknownKeyError struct {
	// Label is the label the value was sealed under.
	Label string
}

// Error implements error.
func (e *UnknownKeyError) Error() string {
	return fmt.Sprintf("sealed under key label %q, which the keyring does not hold (add its key to encryption.keys)", e.Label)
}

// ErrCorrupt is a value that looks sealed but is not a well-formed envelope, or that fails
// authentication (wrong key under the right label, tampered bytes, or moved to another key).
var ErrCorrupt = errors.New("sealed value is corrupt or does not authenticate")

// Keyring holds the keys by label and the active label that seals new values. A nil *Keyring is
// encryption off: Seal returns plaintext unchanged, and Open opens clear values only. A Keyring
// is immutable and safe for concurrent use.
type Keyring struct {
	active string
	aeads  map[string]cipher.AEAD
}

// NewKeyring returns a keyring sealing under active, which must be one of keys' labels.
func NewKeyring(active string, keys map[string]Key) (*Keyring, error) {
	if _, ok := keys[active]; !ok {
		return nil, fmt.Errorf("active key label %q has no key", active)
	}
	kr := &Keyring{active: active, aeads: make(map[string]cipher.AEAD, len(keys))}
	for label, k := range keys {
		if err := checkLabel(label); err != nil {
			return nil, err
		}
		block, err := aes.NewCipher(k[:])
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", label, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", label, err)
		}
		kr.aeads[label] = aead
	}
	return kr, nil
}

// checkLabel reports a label that cannot be stored in an envelope.
func checkLabel(label string) error {
	if label == "" {
		return errors.New("key label is empty")
	}
	if len(label) > MaxLabelLen {
		return fmt.Errorf("key label %q is longer than %d bytes", label, MaxLabelLen)
	}
	return nil
}

// Active is the label new values are sealed under ("" for a nil keyring: encryption off).
func (k *Keyring) Active() string {
	if k == nil {
		return ""
	}
	return k.active
}

// Labels are the labels of the keyring's keys, sorted.
func (k *Keyring) Labels() []string {
	if k == nil {
		return nil
	}
	out := make([]string, 0, len(k.aeads))
	for l := range k.aeads {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// Seal encrypts plaintext under the active key, bound to context (the record's etcd key). A
// nil keyring returns plaintext itself.
func (k *Keyring) Seal(context string, plaintext []byte) ([]byte, error) {
	if k == nil {
		return plaintext, nil
	}
	aead := k.aeads[k.active]
	hl := headerMin + len(k.active)
	out := make([]byte, hl+nonceSize, hl+nonceSize+len(plaintext)+aead.Overhead())
	out[0], out[1], out[2] = magic, version1, byte(len(k.active))
	copy(out[headerMin:], k.active)
	nonce := out[hl : hl+nonceSize]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: random nonce: %w", err)
	}
	return aead.Seal(out, nonce, plaintext, aad(out[:hl], context)), nil
}

// Open returns the plaintext of value, which context (the record's etcd key) was sealed with,
// and the label it was sealed under: "" for a clear value, returned as it is. A value sealed
// under a label the keyring lacks is an *UnknownKeyError; one that does not authenticate is
// ErrCorrupt.
func (k *Keyring) Open(context string, value []byte) (plaintext []byte, label string, err error) {
	label, sealed, err := LabelOf(value)
	if err != nil || !sealed {
		return value, "", err
	}
	var aead cipher.AEAD
	if k != nil {
		aead = k.aeads[label]
	}
	if aead == nil {
		return nil, label, &UnknownKeyError{Label: label}
	}
	hl := headerMin + len(label)
	if len(value) < hl+nonceSize+aead.Overhead() {
		return nil, label, ErrCorrupt
	}
	pt, err := aead.Open(nil, value[hl:hl+nonceSize], value[hl+nonceSize:], aad(value[:hl], context))
	if err != nil {
		return nil, label, ErrCorrupt
	}
	return pt, label, nil
}

// NeedsReseal reports whether a value sealed under label ("" for clear) should be sealed again
// under the active key. It is never true with encryption off: clear values then stay clear.
func (k *Keyring) NeedsReseal(label string) bool {
	return k != nil && label != k.active
}

// LabelOf reads the label of a sealed value without opening it; sealed is false for a clear
// value. A value that starts like an envelope but is not one is ErrCorrupt.
func LabelOf(value []byte) (label string, sealed bool, err error) {
	if len(value) == 0 || value[0] != magic {
		return "", false, nil
	}
	if len(value) < headerMin || value[1] != version1 {
		return "", true, fmt.Errorf("%w: unknown envelope version", ErrCorrupt)
	}
	n := int(value[2])
	if n == 0 || len(value) < headerMin+n {
		return "", true, fmt.Errorf("%w: truncated label", ErrCorrupt)
	}
	return string(value[headerMin : headerMin+n]), true, nil
}

// aad is the additional authenticated data of an envelope: its header, then the context.
func aad(header []byte, context string) []byte {
	b := make([]byte, 0, len(header)+len(context))
	b = append(b, header...)
	return append(b, context...)
}
