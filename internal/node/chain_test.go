package node_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

// TestChainCheckedBeforeHeads forges an event while the node runs, then
// lets the node snapshot and save its chain head past it: the check that
// runs before each head is saved finds it, /readyz's warning names it, and
// a node started again on the log (whose head is now past the forgery)
// still does.
func TestChainCheckedBeforeHeads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keyFile := filepath.Join(t.TempDir(), "chain.key")
	chain := func(c *node.Config) { c.ChainKeyFile, c.SnapshotEvery = keyFile, 4 }
	n := testnode.Start(t, chain)
	if info, err := os.Stat(keyFile); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", info, err)
	}
	schedule := func(n *testnode.Node, text string) api.Task {
		t.Helper()
		task, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "chain",
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: text}}}})
		if err != nil {
			t.Fatal(err)
		}
		return testnode.Settled(t, n.Client, task)
	}
	victim := schedule(n, "victim")
	if w := n.LogWarning(); w != "" {
		t.Fatalf("a clean keyed log warns: %q", w)
	}

	// A writer without the key: the next event, with the right unkeyed link.
	seq := forgeNext(t, n, victim)
	// Enough events for snapshots past it (one every 4 events).
	for i := range 4 {
		schedule(n, "after "+strconv.Itoa(i))
	}
	want := "(the first at sequence " + strconv.FormatUint(uint64(seq), 10) + ", task " + victim.ID + ": unkeyed)"
	testnode.Eventually(t, "the forged event found before a head was saved past it", func() bool {
		return strings.Contains(n.LogWarning(), want)
	})
	n.Stop()

	again := testnode.Start(t, testnode.On(n.NC, n.NS), chain)
	if w := again.LogWarning(); !strings.Contains(w, want) {
		t.Fatalf("after a restart: /readyz warning %q, want %q", w, want)
	}
}

// forgeNext appends to task's subject, as a writer without the key would,
// the next event: a Canceled with the right number and the right unkeyed
// hash link. It returns its log position (on an unsharded log, its
// sequence).
func forgeNext(t *testing.T, n *testnode.Node, task api.Task) events.Position {
	t.Helper()
	ctx := context.Background()
	log := n.Store.Log()
	evs, err := log.Task(ctx, task.ID)
	if err != nil || len(evs) == 0 {
		t.Fatalf("task %s: %d events, %v", task.ID, len(evs), err)
	}
	part := evs[len(evs)-1].Seq.Part(log.Shards)
	js, err := jetstream.New(n.NC)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, log.Shards.Stream(n.NS.Stream, part))
	if err != nil {
		t.Fatal(err)
	}
	subject := log.Shards.Subjects(n.NS.Subjects, part).Event(task.CustomerID, task.ID)
	last, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	prev, err := events.Decode(last.Data)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := events.Encode(events.Event{ID: events.NewID(), TaskID: task.ID, CustomerID: task.CustomerID, Number: prev.Number + 1,
		At: time.Now(), Actor: "scheduler", Prev: events.HashOf(last.Data), Data: events.Canceled{Reason: "forged"}})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, subject, forged, jetstream.WithExpectLastSequencePerSubject(last.Sequence))
	if err != nil {
		t.Fatal(err)
	}
	return log.Shards.Position(part, ack.Sequence)
}

// TestChainKeyedOnAnOldLog keys a log written unkeyed (by a build from
// before keying): the key file records where keying began, the old events
// verify by their links alone, and an unkeyed event appended afterwards
// to an old task (a downgrade to the old link) is found at the next start
// and by replay verify, and nothing else is.
func TestChainKeyedOnAnOldLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schedule := func(n *testnode.Node, text string) api.Task {
		t.Helper()
		task, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "chain",
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: text}}}})
		if err != nil {
			t.Fatal(err)
		}
		return testnode.Settled(t, n.Client, task)
	}
	old := testnode.Start(t) // no key: the log of an older build
	oldTask := schedule(old, "before keying")
	old.Stop()
	last, err := old.Store.Log().LastPositions(ctx)
	if err != nil {
		t.Fatal(err)
	}

	keyFile := filepath.Join(t.TempDir(), chainkey.FileName)
	chain := func(c *node.Config) { c.ChainKeyFile = keyFile }
	keyed := testnode.Start(t, testnode.On(old.NC, old.NS), chain)
	f, err := chainkey.Load(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.KeyedFrom[old.NS.Stream], uint64(last[0])+1; got != want {
		t.Fatalf("keyedFrom %v, want %s keyed from %d", f.KeyedFrom, old.NS.Stream, want)
	}
	schedule(keyed, "after keying")
	if w := keyed.LogWarning(); w != "" {
		t.Fatalf("an old log, keyed: %q", w)
	}
	seq := forgeNext(t, keyed, oldTask)
	keyed.Stop()

	again := testnode.Start(t, testnode.On(old.NC, old.NS), chain)
	want := "1 events of the log are not vouched for by its chain key (the first at sequence " + strconv.FormatUint(uint64(seq), 10) + ", task " + oldTask.ID + ": unkeyed)"
	if w := again.LogWarning(); !strings.Contains(w, want) {
		t.Fatalf("/readyz warning %q, want %q", w, want)
	}
	keys, err := f.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	v := replay.NewVerifier(old.NS.Subjects)
	v.Keyed(replay.NewChain(keys, f.Parts(old.NS.Stream, events.Shards{})))
	if err := again.Store.Log().Read(ctx, eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := v.Report().Violations; len(got) != 1 || got[0].Kind != replay.Unkeyed || got[0].Seq != seq {
		t.Fatalf("replay verify: %+v, want one unkeyed at %d", got, seq)
	}
}

// TestChainCheckedAtShutdown forges an event while the node runs, lets
// the node write more and stop cleanly without a snapshot in between: the
// check before the shutdown's chain heads finds it, and the next start,
// whose heads are past it, still shows it; on one stream and on three
// shards.
func TestChainCheckedAtShutdown(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{1, 3} {
		t.Run("Shards"+strconv.Itoa(shards), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			keyFile := filepath.Join(t.TempDir(), chainkey.FileName)
			chain := func(c *node.Config) {
				c.ChainKeyFile, c.Shards, c.SnapshotEvery, c.SnapshotInterval = keyFile, shards, 1<<40, time.Hour
			}
			n := testnode.Start(t, chain)
			schedule := func(text string) api.Task {
				t.Helper()
				task, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "chain",
					Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: text}}}})
				if err != nil {
					t.Fatal(err)
				}
				return testnode.Settled(t, n.Client, task)
			}
			victim := schedule("victim")
			for i := range 4 {
				schedule("before " + strconv.Itoa(i))
			}
			pos := forgeNext(t, n, victim)
			for i := range 4 {
				schedule("after " + strconv.Itoa(i))
			}
			n.Stop()
			heads, err := node.LoadHeads(ctx, n.Store.JetStream(), n.NS.Stream)
			if err != nil {
				t.Fatal(err)
			}
			log := n.Store.Log()
			covered := false
			for _, h := range heads {
				covered = covered || h.Pos.Part(log.Shards) == pos.Part(log.Shards) && h.Pos.Seq(log.Shards) >= pos.Seq(log.Shards)
			}
			if !covered {
				t.Fatalf("heads %v: none saved at or past the forgery at %d", heads, pos)
			}
			again := testnode.Start(t, testnode.On(n.NC, n.NS), chain)
			want := "1 events of the log are not vouched for by its chain key (the first at sequence " + strconv.FormatUint(uint64(pos), 10) + ", task " + victim.ID + ": unkeyed)"
			if w := again.LogWarning(); !strings.Contains(w, want) {
				t.Fatalf("/readyz warning %q, want %q", w, want)
			}
			resp, err := http.Get(again.URL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !strings.Contains(string(body), "\ntaskledger_chain_unverified_events 1\n") {
				t.Fatalf("metrics (%v) lack taskledger_chain_unverified_events 1:\n%s", err, body)
			}
		})
	}
}

// TestChainKeyAgreement starts processes on one keyed log: one without
// the key file refuses to start (and makes none), one with a key file of
// its own (as a second process would make at the same first start)
// refuses, and one with a copy of the log's key file starts.
func TestChainKeyAgreement(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	logKey := filepath.Join(dir, "log.key")
	first := testnode.Start(t, func(c *node.Config) { c.ChainKeyFile = logKey })
	open := func(keyFile string) error {
		t.Helper()
		cfg := node.Config{NC: first.NC, Stream: first.NS.Stream, ReadyStream: first.NS.ReadyStream, Subjects: first.NS.Subjects,
			ChainKeyFile: keyFile, Logger: zerolog.Nop(), NoLeases: true}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := node.New(ctx, cfg)
		return err
	}
	none := filepath.Join(dir, "none.key")
	if err := open(none); !errors.Is(err, node.ErrChainKeyMissing) || !strings.Contains(err.Error(), "--chain-key-file") {
		t.Fatalf("a start without the key file: %v, want ErrChainKeyMissing", err)
	}
	if _, err := os.Stat(none); err == nil {
		t.Fatal("a start on a keyed log made a key file")
	}
	own := filepath.Join(dir, "own.key")
	if _, err := chainkey.Create(own, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := open(own); !errors.Is(err, eventlog.ErrChainKeyMismatch) {
		t.Fatalf("a start with a key of its own: %v, want ErrChainKeyMismatch", err)
	}
	b, err := os.ReadFile(logKey)
	if err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(dir, "copy.key")
	if err := os.WriteFile(copied, b, 0o600); err != nil {
		t.Fatal(err)
	}
	second := testnode.Start(t, testnode.On(first.NC, first.NS), func(c *node.Config) { c.ChainKeyFile = copied })
	if w := second.LogWarning(); w != "" {
		t.Fatalf("a second process with the log's key: %q", w)
	}
}
