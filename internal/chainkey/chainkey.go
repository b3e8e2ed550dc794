// Package chainkey reads and writes the key file of a log's keyed chain
// (events/doc.go, "Keyed chain"): the HMAC keys the scheduler signs every
// event with, and where each stream of the log began to be keyed. The
// file lives outside the log (by default in serve's data directory,
// beside JetStream's store, never in it): whoever can write to the
// event stream but cannot read this file cannot forge an event.
//
// The file is JSON, mode 0600:
//
//	{"keys": [{"id": 1, "secret": "<base64 of 32 bytes>", "created": "<RFC 3339>"}],
//	 "keyedFrom": {"TASKLEDGER": 1235}}
//
// keys: every key the log's events were signed with; the highest id signs.
// keyedFrom: by stream name, the first sequence written with a key in a
// stream that held unkeyed events before (a log created before the chain
// was keyed); a stream not named was keyed from its first event.
package chainkey

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/taskledger/taskledger/events"
)

// FileName is the key file's name in serve's data directory.
const FileName = "chain.key"

// ErrNoFile is returned by Load when the key file does not exist; it
// wraps fs.ErrNotExist.
var ErrNoFile = fmt.Errorf("chainkey: no key file: %w", fs.ErrNotExist)

// Key is one chain key of the file.
type Key struct {
	ID      uint32    `json:"id"`
	Secret  []byte    `json:"secret"` // base64 in the file
	Created time.Time `json:"created"`
}

// File is the content of a key file.
type File struct {
	Keys []Key `json:"keys"`
	// KeyedFrom is, by stream name, the first sequence of a stream that
	// must be keyed; a stream not in it must be keyed throughout.
	KeyedFrom map[string]uint64 `json:"keyedFrom,omitempty"`
}

// Keyring returns the file's keys as an events.Keyring.
func (f File) Keyring() (*events.Keyring, error) {
	keys := make([]events.ChainKey, len(f.Keys))
	for i, k := range f.Keys {
		keys[i] = events.ChainKey{ID: k.ID, Secret: k.Secret}
	}
	kr, err := events.NewKeyring(keys...)
	if err != nil {
		return nil, fmt.Errorf("chainkey: %w", err)
	}
	return kr, nil
}

// Parts returns KeyedFrom by part of a log whose streams are named by
// shards from base (events.Shards.Stream), for replay.NewChain.
func (f File) Parts(base string, shards events.Shards) map[int]uint64 {
	parts := map[int]uint64{}
	for i := range shards.N() {
		if seq, ok := f.KeyedFrom[shards.Stream(base, i)]; ok {
			parts[i] = seq
		}
	}
	return parts
}

// Load reads the key file at path. It returns an error wrapping ErrNoFile
// when there is none, and refuses a file others may read (its mode must
// not grant the group or others anything) or one without a valid key.
func Load(path string) (File, error) {
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return File{}, fmt.Errorf("%w: %s", ErrNoFile, path)
	}
	if err != nil {
		return File{}, fmt.Errorf("chainkey: %w", err)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return File{}, fmt.Errorf("chainkey: %s has mode %04o: a chain key must be readable by its owner only (chmod 600 %s)", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("chainkey: %w", err)
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return File{}, fmt.Errorf("chainkey: %s: %w", path, err)
	}
	if _, err := f.Keyring(); err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Create writes a new key file at path with one fresh key (id 1, 32
// bytes from crypto/rand) and keyedFrom, and returns it. It fails if a
// file exists there: a key is never overwritten.
func Create(path string, keyedFrom map[string]uint64, now time.Time) (File, error) {
	k, err := newKey(1, now)
	if err != nil {
		return File{}, err
	}
	f := File{Keys: []Key{k}, KeyedFrom: keyedFrom}
	return f, write(path, f, false)
}

// Rotate adds a fresh key to the key file at path, with the next id, and
// returns the file: the new key signs from the next start of each process
// that reads the file, and the older keys stay to verify what they signed.
func Rotate(path string, now time.Time) (File, error) {
	f, err := Load(path)
	if err != nil {
		return File{}, err
	}
	next := uint32(0)
	for _, k := range f.Keys {
		next = max(next, k.ID)
	}
	k, err := newKey(next+1, now)
	if err != nil {
		return File{}, err
	}
	f.Keys = append(slices.Clip(f.Keys), k)
	return f, write(path, f, true)
}

// newKey returns a key of id with a fresh secret.
func newKey(id uint32, now time.Time) (Key, error) {
	secret := make([]byte, events.MinChainKeyBytes)
	if _, err := rand.Read(secret); err != nil {
		return Key{}, fmt.Errorf("chainkey: %w", err)
	}
	return Key{ID: id, Secret: secret, Created: now.UTC()}, nil
}

// write writes f to path, mode 0600, through a temporary file renamed
// into place after an fsync, so a crash leaves the old file or the new
// one. Without replace it fails when path exists.
func write(path string, f File, replace bool) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("chainkey: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("chainkey: %w", err)
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("chainkey: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	if _, err = tmp.Write(append(b, '\n')); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("chainkey: write %s: %w", path, err)
	}
	if !replace {
		// Checked just before the rename (a link would be exact, but not
		// every file system has links): one process creates a data
		// directory's key, the one that holds its embedded server's lock.
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("chainkey: %s exists: a key file is never overwritten", path)
		}
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("chainkey: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("chainkey: sync %s: %w", dir, err)
		}
	}
	return nil
}
