package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
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
	js, err := jetstream.New(n.NC)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, n.NS.Stream)
	if err != nil {
		t.Fatal(err)
	}
	subject := n.NS.Subjects.Event(victim.CustomerID, victim.ID)
	last, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	prev, err := events.Decode(last.Data)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := events.Encode(events.Event{ID: events.NewID(), TaskID: victim.ID, CustomerID: victim.CustomerID, Number: prev.Number + 1,
		At: time.Now(), Actor: "scheduler", Prev: events.HashOf(last.Data), Data: events.Canceled{Reason: "forged"}})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, subject, forged, jetstream.WithExpectLastSequencePerSubject(last.Sequence))
	if err != nil {
		t.Fatal(err)
	}
	// Enough events for snapshots past it (one every 4 events).
	for i := range 4 {
		schedule(n, "after "+strconv.Itoa(i))
	}
	want := "(the first at sequence " + strconv.FormatUint(ack.Sequence, 10) + ", task " + victim.ID + ": unkeyed)"
	testnode.Eventually(t, "the forged event found before a head was saved past it", func() bool {
		return strings.Contains(n.LogWarning(), want)
	})
	n.Stop()

	again := testnode.Start(t, testnode.On(n.NC, n.NS), chain)
	if w := again.LogWarning(); !strings.Contains(w, want) {
		t.Fatalf("after a restart: /readyz warning %q, want %q", w, want)
	}
}
