package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// startWithStream starts a server with one stream X on x.> of cfg's
// limits and returns it with a JetStream client.
func startWithStream(t *testing.T, cfg jetstream.StreamConfig) (*Embedded, jetstream.JetStream) {
	t.Helper()
	e, err := StartEmbedded(EmbeddedConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	nc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Name, cfg.Subjects = "X", []string{"x.>"}
	if _, err := js.CreateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	return e, js
}

// TestSyncSharesRounds: concurrent writers that each wait for Sync after
// their append are all answered, by fewer fsync passes than callers.
func TestSyncSharesRounds(t *testing.T) {
	t.Parallel()
	e, js := startWithStream(t, jetstream.StreamConfig{})
	const writers, each = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for range each {
				if _, err := js.Publish(t.Context(), "x."+string(rune('a'+w%26)), []byte("payload")); err != nil {
					errs <- err
					return
				}
				if err := e.Sync(t.Context()); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := e.CommitStats()
	if st.Callers != writers*each || st.Rounds == 0 || st.Rounds >= st.Callers || st.Err != nil {
		t.Fatalf("stats %+v: want %d callers sharing fewer rounds, no error", st, writers*each)
	}
}

// TestSyncFollowsBlocks: as a stream starts new blocks (and removes the
// oldest past its byte limit), Sync moves to the highest block, the one
// the store appends to.
func TestSyncFollowsBlocks(t *testing.T) {
	t.Parallel()
	// 120 kB of limit: the store picks its smallest blocks, 32 kB.
	e, js := startWithStream(t, jetstream.StreamConfig{MaxBytes: 120_000})
	msgs := filepath.Join(e.srv.StoreDir(), "$G", "streams", "X", "msgs")
	body := make([]byte, 1000)
	for i := range 400 {
		if _, err := js.Publish(t.Context(), "x.a", body); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 { // some rounds span several new blocks
			if err := e.Sync(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := e.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(msgs)
	if err != nil {
		t.Fatal(err)
	}
	var highest, blocks uint64
	for _, en := range entries {
		if n := blockIndex(en.Name()); n > 0 {
			blocks++
			highest = max(highest, n)
		}
	}
	if highest < 5 {
		t.Fatalf("the stream has only reached block %d; the test wants several roll-overs", highest)
	}
	b := e.commit.files.streams[filepath.Dir(msgs)]
	if b == nil || b.n != highest || b.f == nil || b.synced <= 0 {
		t.Fatalf("active block %+v, want block %d open and synced (%d blocks in %s)", b, highest, blocks, msgs)
	}
}

// TestSyncAfterShutdown: a Sync after the server stopped answers
// ErrStopped instead of waiting; one with a done context answers its
// error.
func TestSyncAfterShutdown(t *testing.T) {
	t.Parallel()
	e, _ := startWithStream(t, jetstream.StreamConfig{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := e.Sync(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync with a canceled context: %v", err)
	}
	e.Shutdown()
	done := make(chan error, 1)
	go func() { done <- e.Sync(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("Sync after Shutdown: %v, want ErrStopped", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sync after Shutdown did not return")
	}
}

// TestActiveBlockFollows: the active block is the highest of a listing,
// every block started and filled between two passes is fsynced once
// more, and a hole in the block numbers (an emptied block removed) does
// not stop the search at the block before it.
func TestActiveBlockFollows(t *testing.T) {
	t.Parallel()
	msgs := t.TempDir()
	touch := func(n int) {
		if err := os.WriteFile(filepath.Join(msgs, fmt.Sprintf("%d.blk", n)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for n := 1; n <= 3; n++ {
		touch(n)
	}
	b := &activeBlock{msgs: msgs}
	defer b.close()
	if _, err := b.scan(nil); err != nil || b.n != 3 {
		t.Fatalf("first scan: block %d, %v; want 3", b.n, err)
	}
	for n := 4; n <= 6; n++ {
		touch(n)
	}
	b.mtime = time.Time{} // as if the directory's time moved
	jobs, err := b.scan(nil)
	if err != nil || b.n != 6 {
		t.Fatalf("after blocks 4–6: block %d, %v; want 6", b.n, err)
	}
	var paths []string
	for _, j := range jobs {
		if j.path != "" {
			paths = append(paths, filepath.Base(j.path))
		}
	}
	if want := []string{"4.blk", "5.blk", filepath.Base(msgs)}; !slices.Equal(paths, want) {
		t.Fatalf("sync jobs by path %v, want %v (the filled blocks, then the directory)", paths, want)
	}
	for n := 5; n <= 6; n++ {
		if err := os.Remove(filepath.Join(msgs, fmt.Sprintf("%d.blk", n))); err != nil {
			t.Fatal(err)
		}
	}
	b.close()
	b.mtime = time.Time{}
	if _, err := b.scan(nil); err != nil || b.n != 4 {
		t.Fatalf("after the active block's removal: block %d, %v; want 4 from a listing", b.n, err)
	}
	// A hole: block 5 started, filled and emptied (removed) between two
	// passes while block 6 became the active one; 4 is still there.
	touch(5)
	touch(6)
	if err := os.Remove(filepath.Join(msgs, "5.blk")); err != nil {
		t.Fatal(err)
	}
	b.mtime = time.Time{}
	if _, err := b.scan(nil); err != nil || b.n != 6 {
		t.Fatalf("past a hole in the block numbers: block %d, %v; want 6", b.n, err)
	}
}

// TestRewrittenBlocksSynced: a block nats-server rewrites by renaming a
// new file over it (a compaction; the active block's rewrite) is fsynced
// with its directory, and a rewritten active block is reopened, so the
// writes after the rewrite are synced in the new file, not the old one.
func TestRewrittenBlocksSynced(t *testing.T) {
	t.Parallel()
	msgs := t.TempDir()
	write := func(n int, data string) {
		path := filepath.Join(msgs, fmt.Sprintf("%d.blk", n))
		if err := os.WriteFile(path+".new", []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	for n := 1; n <= 3; n++ {
		write(n, "first")
	}
	b := &activeBlock{msgs: msgs}
	defer b.close()
	jobs, err := b.scan(nil)
	if err != nil || b.n != 3 {
		t.Fatalf("first scan: block %d, %v; want 3", b.n, err)
	}
	runJobs(jobs)
	old := b.f
	if jobs, err = b.scan(nil); err != nil || len(jobs) != 0 {
		t.Fatalf("nothing changed: jobs %+v, %v; want none", jobs, err)
	}

	write(1, "compacted") // an old block compacted
	write(3, "rewritten") // the active block rewritten
	b.mtime = time.Time{} // as if the directory's time moved
	jobs, err = b.scan(nil)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	active := false
	for _, j := range jobs {
		switch {
		case j.path != "":
			paths = append(paths, filepath.Base(j.path))
		case j.f != nil && j.f != old:
			active = true
		}
	}
	if want := []string{"1.blk", filepath.Base(msgs)}; !slices.Equal(paths, want) {
		t.Errorf("sync jobs by path %v, want %v (the compacted block, then the directory)", paths, want)
	}
	if !active || b.f == old {
		t.Errorf("the rewritten active block was not reopened and synced (jobs %+v)", jobs)
	}
}
