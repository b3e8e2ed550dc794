package chainkey

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
)

var now = time.Date(2026, 12, 4, 18, 0, 0, 0, time.UTC)

func TestCreateLoadRotate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sub", FileName)
	if _, err := Load(path); !errors.Is(err, ErrNoFile) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("load of no file: %v, want ErrNoFile", err)
	}
	created, err := Create(path, map[string]uint64{"TASKLEDGER": 7}, now)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o600 {
		t.Fatalf("key file mode %04o, want 0600", perm)
	}
	if _, err := Create(path, nil, now); err == nil {
		t.Fatal("Create overwrote a key file")
	}
	loaded, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(loaded.Keys) != 1 || loaded.Keys[0].ID != 1 || string(loaded.Keys[0].Secret) != string(created.Keys[0].Secret) || len(loaded.Keys[0].Secret) != events.MinChainKeyBytes {
		t.Fatalf("loaded %+v, created %+v", loaded, created)
	}
	if got := loaded.Parts("TASKLEDGER", events.Shards{}); got[0] != 7 || len(got) != 1 {
		t.Fatalf("parts %v, want part 0 keyed from 7", got)
	}
	if got := loaded.Parts("OTHER", events.Shards{}); len(got) != 0 {
		t.Fatalf("another stream's parts %v, want none", got)
	}

	rotated, err := Rotate(path, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(rotated.Keys) != 2 || rotated.Keys[1].ID != 2 || string(rotated.Keys[0].Secret) != string(created.Keys[0].Secret) || rotated.KeyedFrom["TASKLEDGER"] != 7 {
		t.Fatalf("rotated %+v", rotated)
	}
	kr, err := rotated.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	if kr.Signer() != 2 || !kr.Has(1) {
		t.Fatalf("signer %d, has key 1 %v: the new key signs, the old one stays", kr.Signer(), kr.Has(1))
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("rotated file: %v %v", info.Mode(), err)
	}
	if leftovers, _ := filepath.Glob(path + ".*.tmp"); len(leftovers) != 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
}

func TestLoadRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.key")
	if _, err := Create(good, nil, now); err != nil {
		t.Fatal(err)
	}
	readable := filepath.Join(dir, "readable.key")
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(readable, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(readable); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable key file: %v", err)
	}
	for name, content := range map[string]string{
		"NoKey":    `{"keys": []}`,
		"ShortKey": `{"keys": [{"id": 1, "secret": "c2hvcnQ="}]}`,
		"IDZero":   `{"keys": [{"id": 0, "secret": "` + strings.Repeat("A", 44) + `"}]}`,
		"NotJSON":  `secret`,
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}
