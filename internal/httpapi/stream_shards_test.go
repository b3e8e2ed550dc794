package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
)

// logEventIDs returns the id of every event of the node's log, shard
// after shard.
func logEventIDs(t *testing.T, n *node.Node) []string {
	t.Helper()
	var out []string
	for _, ev := range testnode.LogEvents(t, n.Store) {
		out = append(out, ev.ID)
	}
	return out
}

// TestShardedStreamResumesExactly: on a log of three shards the stream's
// ids are resume tokens of three sequences; a stream read in part and
// resumed with Last-Event-ID, and the Go client's, get every event of the
// log once, each shard in order. A token of another form is 400.
func TestShardedStreamResumesExactly(t *testing.T) {
	t.Parallel()
	n := validatedNode(t, func(c *node.Config) { c.Shards = 3 })
	shards := n.Store.Shards()
	scheduleN(t, n.Client, "q", 30)
	var got []string
	lastPos := make([]uint64, 3)
	take := func(m sseMsg) {
		t.Helper()
		e := m.decoded(t)
		if parts := strings.Split(m.id, "-"); len(parts) != 3 || e.Cursor != m.id {
			t.Fatalf("id %q, cursor %q: want three sequences, the same", m.id, e.Cursor)
		}
		shard, _ := shards.Split(events.Position(e.Seq))
		if e.Seq <= lastPos[shard] {
			t.Fatalf("event at %d after %d in shard %d", e.Seq, lastPos[shard], shard)
		}
		lastPos[shard] = e.Seq
		got = append(got, e.ID)
	}
	s := openStream(t, n.URL, "", "after=0-0-0", "")
	var lastID string
	var first []string
	for range 5 {
		m := s.next(t)
		take(m)
		lastID = m.id
	}
	first = slices.Clone(got)
	s.close()
	scheduleN(t, n.Client, "q", 10)
	want := logEventIDs(t, n.Node)
	s = openStream(t, n.URL, "", "after=0-0-0", lastID) // Last-Event-ID wins
	for len(got) < len(want) {
		take(s.next(t))
	}
	s.close()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("streamed %d events, the log holds %d:\n%v\n%v", len(got), len(want), got, want)
	}
	for i := range lastPos {
		if lastPos[i] == 0 {
			t.Fatalf("shard %d sent no event: %v", i, lastPos)
		}
	}

	var client []string
	errDone := errors.New("done")
	err := n.Client.Stream(context.Background(), api.StreamFilter{}, 0, func(e api.Event) error {
		client = append(client, e.ID)
		if len(client) == len(want) {
			return errDone
		}
		return nil
	})
	slices.Sort(client)
	if !errors.Is(err, errDone) || !slices.Equal(client, want) {
		t.Fatalf("the Go client streamed %d events (%v), the log holds %d", len(client), err, len(want))
	}
	// The Go client from a cursor: the rest of the log.
	rest := slices.Clone(first)
	err = n.Client.StreamAfter(context.Background(), api.StreamFilter{}, lastID, func(e api.Event) error {
		rest = append(rest, e.ID)
		if len(rest) == len(want) {
			return errDone
		}
		return nil
	})
	slices.Sort(rest)
	if !errors.Is(err, errDone) || !slices.Equal(rest, want) {
		t.Fatalf("the Go client from %s streamed %d events with the first 5 (%v), the log holds %d", lastID, len(rest), err, len(want))
	}

	for _, bad := range []string{"after=5", "after=1-2", "after=1-x-3", "after=6148914691236517206-0-0", "after=1-2-3-4"} {
		resp, cancel := streamRequest(t, n.URL, "", bad, "")
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %d, want 400", bad, resp.StatusCode)
		}
	}
}
