package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
)

// TestRuns checks the runs bucket's configuration and its revisions:
// each save is readable as it was, a snapshot or a change, and the
// changes replay to the same runs.
func TestRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := testnats.Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ns := testnats.NewNamespace(t)
	runs, err := store.OpenRuns(ctx, js, store.RunsConfig{Stream: ns.Stream})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, store.RunsBucket(ns.Stream))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	save := func(t *testing.T, id string, base uint64, doc string) store.Run {
		t.Helper()
		canon, err := store.Canonical([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		run, err := runs.Save(ctx, id, base, store.Run{DeliveryID: "d1", UpdatedAt: at, Doc: canon})
		if err != nil {
			t.Fatal(err)
		}
		if run.Revision != base+1 || run.Digest != store.RunDigest(canon) || run.Change == nil {
			t.Fatalf("saved %+v", run)
		}
		return run
	}

	t.Run("Bucket", func(t *testing.T) {
		if store.RunsBucket(events.DefaultStream) == "TASKLEDGER_RUNS" {
			t.Fatal("the runs bucket of the default stream is executor.KVCheckpoints' default bucket")
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
		if cfg.MaxMsgsPerSubject != 1 || cfg.Storage != jetstream.FileStorage || cfg.Replicas != 1 || cfg.MaxAge != 0 {
			t.Fatalf("bucket: history %d, storage %v, replicas %d, max age %s (want none: a run lives as long as its log)", cfg.MaxMsgsPerSubject, cfg.Storage, cfg.Replicas, cfg.MaxAge)
		}
	})

	t.Run("Revisions", func(t *testing.T) {
		id := events.NewID()
		if _, err := runs.Get(ctx, id, 1); !errors.Is(err, store.ErrNoRun) {
			t.Fatalf("get before a save: %v, want ErrNoRun", err)
		}
		// More than a snapshot interval, so reads cross snapshots and
		// changes: transcript appends, a context's new version, a phase.
		var docs []string
		for i := range store.RunSnapshotEvery + 5 {
			items := make([]string, i+1)
			for j := range items {
				items[j] = fmt.Sprintf(`{"id":"i%d","kind":"note","turn":%d}`, j, j)
			}
			doc := fmt.Sprintf(`{"turn": %d, "phase": "p%d", "transcript": [%s], "contexts": {"a": {"version": %d, "value": "v"}, "b": {"version": 1, "value": 2.50}}}`,
				i, i%3, strings.Join(items, ","), i/4+1)
			docs = append(docs, doc)
			save(t, id, uint64(i), doc)
		}
		for i, doc := range docs {
			got, err := runs.Get(ctx, id, uint64(i+1))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := store.Canonical([]byte(doc))
			if string(got.Doc) != string(want) || got.Revision != uint64(i+1) || got.Digest != store.RunDigest(want) || got.DeliveryID != "d1" || !got.UpdatedAt.Equal(at) {
				t.Fatalf("revision %d: %+v\nwant %s", i+1, got, want)
			}
		}
		// A change holds the new transcript item only, and the context
		// that changed.
		var n int
		err := runs.Changes(ctx, id, 2, uint64(len(docs)), func(r store.Run) error {
			n++
			c := r.Change
			if c.Transcript == nil || c.Transcript.Keep != int(r.Revision-1) || len(c.Transcript.Append) != 1 {
				return fmt.Errorf("revision %d: transcript change %+v", r.Revision, c.Transcript)
			}
			if _, ok := c.Members["contexts"].Set["b"]; ok {
				return fmt.Errorf("revision %d: unchanged context b in the change", r.Revision)
			}
			want, _ := store.Canonical([]byte(docs[r.Revision-1]))
			if string(r.Doc) != string(want) {
				return fmt.Errorf("revision %d: %s, want %s", r.Revision, r.Doc, want)
			}
			return nil
		})
		if err != nil || n != len(docs)-2 {
			t.Fatalf("changes: %d, %v", n, err)
		}
		if _, err := runs.Get(ctx, id, uint64(len(docs)+1)); !errors.Is(err, store.ErrNoRun) {
			t.Fatalf("revision past the last: %v", err)
		}
	})

	t.Run("RetryAndLeftOver", func(t *testing.T) {
		id := events.NewID()
		first := save(t, id, 0, `{"turn":1}`)
		// The same save again (its answer was lost) is the same revision.
		again := save(t, id, 0, `{"turn":1}`)
		if again.Revision != first.Revision || again.Digest != first.Digest {
			t.Fatalf("retry: %+v, first %+v", again, first)
		}
		// A record whose RunSaved never landed: another save of the
		// same claim fails while that one may still be on its way to
		// the log, and replaces it once it is older than RunOrphanAge;
		// a save of another claim replaces it at once.
		save(t, id, 1, `{"turn":2,"phase":"left over"}`)
		canon, _ := store.Canonical([]byte(`{"turn":2,"phase":"racing"}`))
		if _, err := runs.Save(ctx, id, 1, store.Run{DeliveryID: "d1", UpdatedAt: at.Add(store.RunOrphanAge / 2), Doc: canon}); !errors.Is(err, store.ErrRunRevision) {
			t.Fatalf("a save of the claim over its fresh record: %v, want ErrRunRevision", err)
		}
		canon, _ = store.Canonical([]byte(`{"turn":2,"phase":"kept"}`))
		if _, err := runs.Save(ctx, id, 1, store.Run{DeliveryID: "d1", UpdatedAt: at.Add(store.RunOrphanAge), Doc: canon}); err != nil {
			t.Fatal(err)
		}
		got, err := runs.Get(ctx, id, 2)
		if err != nil || !strings.Contains(string(got.Doc), "kept") {
			t.Fatalf("revision 2: %s %v", got.Doc, err)
		}
		canon, _ = store.Canonical([]byte(`{"turn":2,"phase":"next claim"}`))
		if _, err := runs.Save(ctx, id, 1, store.Run{DeliveryID: "d2", UpdatedAt: at.Add(store.RunOrphanAge), Doc: canon}); err != nil {
			t.Fatal(err)
		}
		if got, err := runs.Get(ctx, id, 2); err != nil || !strings.Contains(string(got.Doc), "next claim") {
			t.Fatalf("revision 2: %s %v", got.Doc, err)
		}
	})

	t.Run("Damaged", func(t *testing.T) {
		id := events.NewID()
		save(t, id, 0, `{"turn":1,"transcript":[{"id":"a"}]}`)
		second := save(t, id, 1, `{"turn":2,"transcript":[{"id":"a"},{"id":"b"}]}`)
		e, err := kv.Get(ctx, id+".2")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, id+".2", []byte(strings.Replace(string(e.Value()), `"b"`, `"x"`, 1))); err != nil {
			t.Fatal(err)
		}
		got, err := runs.Get(ctx, id, 2)
		if err != nil || got.Digest == second.Digest {
			t.Fatalf("an altered change reads as %+v, %v: its digest must differ", got, err)
		}
		if _, err := kv.Put(ctx, id+".2", []byte(`{"delta":{"transcript":{"keep":7}}}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := runs.Get(ctx, id, 2); !errors.Is(err, store.ErrRunDamaged) {
			t.Fatalf("a change that does not fit: %v, want ErrRunDamaged", err)
		}
	})

	t.Run("Legacy", func(t *testing.T) {
		id := events.NewID()
		if _, err := kv.Put(ctx, id, []byte(`{"deliveryId":"d0","updatedAt":"2026-11-01T00:00:00Z","run":{"turn": 3}}`)); err != nil {
			t.Fatal(err)
		}
		got, err := runs.Get(ctx, id, 0)
		if err != nil || got.Revision != 0 || got.DeliveryID != "d0" || string(got.Doc) != `{"turn": 3}` {
			t.Fatalf("legacy run: %+v %v", got, err)
		}
	})

	t.Run("ArchiveAndRemove", func(t *testing.T) {
		id, other := events.NewID(), events.NewID()
		var docs []store.Run
		for n := range 3 {
			docs = append(docs, save(t, id, uint64(n), fmt.Sprintf(`{"turn":%d,"transcript":[{"id":"i%d"}]}`, n+1, n)))
		}
		save(t, other, 0, `{"turn":1}`)
		var buf bytes.Buffer
		n, err := runs.ExportRuns(ctx, &buf, map[string]uint64{id: 3})
		if err != nil || n != 3 {
			t.Fatalf("export: %d records, %v", n, err)
		}
		archived, err := store.ReadRunArchive(&buf)
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range docs {
			got, err := archived.Get(ctx, id, uint64(i+1))
			if err != nil || string(got.Doc) != string(want.Doc) || got.Digest != want.Digest {
				t.Fatalf("archived revision %d: %s %v, want %s", i+1, got.Doc, err, want.Doc)
			}
		}
		if _, err := archived.Save(ctx, id, 3, docs[0]); err == nil {
			t.Fatal("an archive's runs took a save")
		}
		if _, err := store.ReadRunArchive(strings.NewReader("not json\n")); err == nil {
			t.Fatal("a runs archive of garbage was read")
		}
		if err := runs.Remove(ctx, []string{id}); err != nil {
			t.Fatal(err)
		}
		for rev := uint64(1); rev <= 3; rev++ {
			if _, err := kv.Get(ctx, fmt.Sprintf("%s.%d", id, rev)); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("revision %d after Remove: %v", rev, err)
			}
		}
		if _, err := runs.Get(ctx, other, 1); err != nil {
			t.Fatalf("another task's run after Remove: %v", err)
		}
	})

	t.Run("Feed", func(t *testing.T) {
		id := events.NewID()
		got := make(chan string, 4)
		stop, err := runs.Subscribe(id, 4, func(b []byte) { got <- string(b) })
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		for _, m := range []string{"one", "two"} {
			if err := runs.Publish(id, []byte(m)); err != nil {
				t.Fatal(err)
			}
		}
		for _, want := range []string{"one", "two"} {
			select {
			case m := <-got:
				if m != want {
					t.Fatalf("got %q, want %q", m, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no %q within 5s", want)
			}
		}
		stop()
		stop()
	})
}

// TestRunDeltaRoundTrip checks that any change between two runs, saved
// and read back, gives the second run: fields added and removed,
// transcripts cut and rewritten, objects' members changed.
func TestRunDeltaRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := testnats.Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := store.OpenRuns(ctx, js, store.RunsConfig{Stream: testnats.NewNamespace(t).Stream})
	if err != nil {
		t.Fatal(err)
	}
	docs := []string{
		`{"a":1}`,
		`{"a":1,"transcript":[{"id":"x"}],"contexts":{"c":{"v":1}}}`,
		`{"transcript":[{"id":"y"}],"contexts":{"d":{"v":1}},"b":"<&>"}`,
		`{"transcript":[],"contexts":"gone","b":null}`,
		`{"transcript":null,"contexts":{}}`,
		`{"transcript":[{"id":"z"},{"id":"w"}],"nested":{"deep":{"x":[1,2,{"k":"v"}]}}}`,
		`{}`,
	}
	id := events.NewID()
	for i, doc := range docs {
		canon, err := store.Canonical([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := runs.Save(ctx, id, uint64(i), store.Run{DeliveryID: "d", Doc: canon}); err != nil {
			t.Fatal(err)
		}
		got, err := runs.Get(ctx, id, uint64(i+1))
		if err != nil || string(got.Doc) != string(canon) {
			t.Fatalf("revision %d: %s %v, want %s", i+1, got.Doc, err, canon)
		}
	}
	for _, bad := range []string{`[]`, `{"a":1} {}`, `"x"`, `{`} {
		if _, err := store.Canonical([]byte(bad)); err == nil {
			t.Errorf("Canonical(%s) = nil error", bad)
		}
	}
	if _, err := json.Marshal(docs); err != nil {
		t.Fatal(err)
	}
}
