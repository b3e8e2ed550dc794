package lazyfs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestPatternAppendSyncOtherHandle(t *testing.T) {
	l, mnt, backing := mount(t)
	p := filepath.Join(mnt, "msgs")
	os.Mkdir(p, 0o755)
	p = filepath.Join(p, "1.blk")
	w, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range 300 {
		rec := bytes.Repeat([]byte{byte('a' + i%26)}, 67+i%50)
		if _, err := w.WriteAt(rec, int64(len(want))); err != nil {
			t.Fatal(err)
		}
		want = append(want, rec...)
		fi, _ := s.Stat()
		if fi.Size() != int64(len(want)) {
			t.Fatalf("stat size %d want %d", fi.Size(), len(want))
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	l.Cut()
	w.Close()
	s.Close()
	remount(t, l, mnt, backing)
	got := read(t, p)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes want %d", len(got), len(want))
	}
}

// A file written and not synced, looked up again by name (a new open
// after the kernel forgot the entry), shows its cached size.
func TestPatternLookupSeesCachedSize(t *testing.T) {
	l, mnt, _ := mount(t)
	_ = l
	p := filepath.Join(mnt, "meta.inf")
	if err := os.WriteFile(p, []byte("hello world"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Drop the kernel's dentries and attributes so the next open looks
	// the file up again.
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
	if got := read(t, p); string(got) != "hello world" {
		t.Fatalf("read %q", got)
	}
	if err := os.WriteFile(p, []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
	if got := read(t, p); string(got) != "short" {
		t.Fatalf("read %q", got)
	}
}
