package lazyfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// mount mounts a lazyfs for the test, skipping it loudly where the
// machine has no FUSE (and failing under CI, which must have it).
func mount(t *testing.T) (l *FS, mnt, backing string) {
	t.Helper()
	backing, mnt = t.TempDir(), t.TempDir()
	l, err := Mount(Config{Backing: backing, Mountpoint: mnt})
	if err != nil {
		if errors.Is(err, ErrNoFUSE) && os.Getenv("CI") == "" {
			t.Skipf("SKIPPED: NO FUSE ON THIS MACHINE, the power-cut file system is untested: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Unmount() })
	return l, mnt, backing
}

// remount unmounts l and mounts the same backing directory again, as a
// machine restarted after a power cut would.
func remount(t *testing.T, l *FS, mnt, backing string) *FS {
	t.Helper()
	if err := l.Unmount(); err != nil {
		t.Fatal(err)
	}
	l, err := Mount(Config{Backing: backing, Mountpoint: mnt})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Unmount() })
	return l
}

func write(t *testing.T, path string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLazyFS(t *testing.T) {
	t.Run("SyncedWriteSurvivesCut", func(t *testing.T) {
		l, mnt, backing := mount(t)
		p := filepath.Join(mnt, "a")
		write(t, p, []byte("durable"), true)
		write(t, p, []byte(" lost"), false)
		if got := read(t, p); string(got) != "durable lost" {
			t.Fatalf("before the cut: %q", got)
		}
		if s := l.Cut(); s.CutFiles != 1 {
			t.Fatalf("cut %d files, want 1", s.CutFiles)
		}
		remount(t, l, mnt, backing)
		if got := read(t, p); string(got) != "durable" {
			t.Fatalf("after the cut: %q, want %q", got, "durable")
		}
	})
	t.Run("UnsyncedWriteLost", func(t *testing.T) {
		l, mnt, backing := mount(t)
		p := filepath.Join(mnt, "b")
		write(t, p, bytes.Repeat([]byte("x"), 10000), false)
		if got, _ := os.ReadFile(filepath.Join(backing, "b")); len(got) != 0 {
			t.Fatalf("the backing file holds %d bytes before any fsync", len(got))
		}
		l.Cut()
		remount(t, l, mnt, backing)
		// The name was created (a directory operation, durable at once);
		// its data was never synced.
		if got := read(t, p); len(got) != 0 {
			t.Fatalf("after the cut the file holds %d bytes, want 0", len(got))
		}
	})
	t.Run("ReadYourWrites", func(t *testing.T) {
		_, mnt, _ := mount(t)
		p := filepath.Join(mnt, "c")
		write(t, p, []byte("0123456789"), true)
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// Across a page boundary, past the synced end.
		if _, err := f.WriteAt([]byte("ABC"), 4094); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("zz"), 2); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, 4097)
		copy(want, "01zz456789")
		copy(want[4094:], "ABC")
		if got := read(t, p); !bytes.Equal(got, want) {
			t.Fatalf("read %d bytes, not what was written", len(got))
		}
		fi, err := os.Stat(p)
		if err != nil || fi.Size() != 4097 {
			t.Fatalf("stat: %v, size %d, want 4097", err, fi.Size())
		}
		buf := make([]byte, 4)
		if _, err := f.ReadAt(buf, 4093); err != nil || string(buf) != "\x00ABC" {
			t.Fatalf("ReadAt: %q, %v", buf, err)
		}
	})
	t.Run("RenameKeepsCacheAndIsDurable", func(t *testing.T) {
		l, mnt, backing := mount(t)
		tmp, final := filepath.Join(mnt, "meta.tmp"), filepath.Join(mnt, "meta")
		write(t, tmp, []byte("synced"), true)
		write(t, tmp, []byte("+unsynced"), false)
		if err := os.Rename(tmp, final); err != nil {
			t.Fatal(err)
		}
		if got := read(t, final); string(got) != "synced+unsynced" {
			t.Fatalf("after rename: %q", got)
		}
		l.Cut()
		l = remount(t, l, mnt, backing)
		if _, err := os.Stat(tmp); !os.IsNotExist(err) {
			t.Fatalf("the old name survived the cut: %v", err)
		}
		if got := read(t, final); string(got) != "synced" {
			t.Fatalf("after the cut: %q, want %q", got, "synced")
		}
		// A rename, then fsync under the new name, makes the data durable.
		write(t, final, []byte("!"), false)
		f, err := os.Open(final) // read-only: an fsync through it still syncs
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		l.Cut()
		remount(t, l, mnt, backing)
		if got := read(t, final); string(got) != "synced!" {
			t.Fatalf("after the second cut: %q", got)
		}
	})
	t.Run("TruncateFollowsData", func(t *testing.T) {
		l, mnt, backing := mount(t)
		p := filepath.Join(mnt, "d")
		write(t, p, []byte("0123456789"), true)
		if err := os.Truncate(p, 4); err != nil {
			t.Fatal(err)
		}
		if got := read(t, p); string(got) != "0123" {
			t.Fatalf("after truncate: %q", got)
		}
		if err := os.Truncate(p, 6); err != nil { // grows again: zeros, not the old bytes
			t.Fatal(err)
		}
		if got := read(t, p); string(got) != "0123\x00\x00" {
			t.Fatalf("after growing: %q", got)
		}
		l.Cut()
		l = remount(t, l, mnt, backing)
		if got := read(t, p); string(got) != "0123456789" {
			t.Fatalf("an unsynced truncate survived the cut: %q", got)
		}
		// O_TRUNC is a cached truncate too; synced, it lands.
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("new")); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		l.Cut()
		remount(t, l, mnt, backing)
		if got := read(t, p); string(got) != "new" {
			t.Fatalf("after a synced O_TRUNC: %q", got)
		}
	})
	t.Run("WritebackMakesEarlierWritesDurable", func(t *testing.T) {
		l, mnt, backing := mount(t)
		p := filepath.Join(mnt, "w")
		write(t, p, []byte("old"), false) // closed: only lazyfs holds it
		if err := l.Writeback(); err != nil {
			t.Fatal(err)
		}
		write(t, p, []byte(" new"), false)
		l.Cut()
		remount(t, l, mnt, backing)
		if got := read(t, p); string(got) != "old" {
			t.Fatalf("after the cut: %q, want %q", got, "old")
		}
	})
	t.Run("NothingChangesAfterCut", func(t *testing.T) {
		l, mnt, backing := mount(t)
		p := filepath.Join(mnt, "e")
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write([]byte("before")); err != nil {
			t.Fatal(err)
		}
		l.Cut()
		if _, err := f.Write([]byte("after")); err == nil {
			t.Error("a write after the cut succeeded")
		}
		if err := f.Sync(); err == nil {
			t.Error("an fsync after the cut succeeded")
		}
		if err := os.Mkdir(filepath.Join(mnt, "dir"), 0o755); err == nil {
			t.Error("a mkdir after the cut succeeded")
		}
		f.Close()
		remount(t, l, mnt, backing)
		if got := read(t, p); len(got) != 0 {
			t.Fatalf("after the cut: %q", got)
		}
		if _, err := os.Stat(filepath.Join(mnt, "dir")); !os.IsNotExist(err) {
			t.Fatalf("the directory made after the cut exists: %v", err)
		}
	})
	t.Run("ConcurrentFiles", func(t *testing.T) {
		l, mnt, backing := mount(t)
		const files, writes = 8, 200
		var wg sync.WaitGroup
		for i := range files {
			wg.Go(func() {
				f, err := os.OpenFile(filepath.Join(mnt, fmt.Sprint(i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
				if err != nil {
					t.Error(err)
					return
				}
				defer f.Close()
				for w := range writes {
					if _, err := fmt.Fprintf(f, "%d-%d\n", i, w); err != nil {
						t.Error(err)
						return
					}
					if w == writes/2-1 && i%2 == 0 { // even files sync their first half
						if err := f.Sync(); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
		wg.Wait()
		l.Cut()
		remount(t, l, mnt, backing)
		for i := range files {
			var want bytes.Buffer
			if i%2 == 0 {
				for w := range writes / 2 {
					fmt.Fprintf(&want, "%d-%d\n", i, w)
				}
			}
			if got := read(t, filepath.Join(mnt, fmt.Sprint(i))); !bytes.Equal(got, want.Bytes()) {
				t.Errorf("file %d after the cut: %d bytes, want %d", i, len(got), want.Len())
			}
		}
	})
}

// An append through one handle, fsynced through another opened read-only
// (the group commit's way), survives a cut.
func TestLazyFSSyncThroughOtherHandle(t *testing.T) {
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
func TestLazyFSLookupSeesCachedSize(t *testing.T) {
	_, mnt, _ := mount(t)
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
