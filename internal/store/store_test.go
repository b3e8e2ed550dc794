package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// schedule appends a root task (the shared harness's).
var schedule = testnode.ScheduleRoot

func TestMain(m *testing.M) { testnats.Main(m) }

func setup(t *testing.T, nc *nats.Conn) *store.Store {
	t.Helper()
	ns := testnats.NewNamespace(t)
	st, err := store.Open(context.Background(), nc, store.Config{Stream: ns.Stream, Subjects: ns.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// another opens a second Store on st's stream, as another scheduler
// process would, with its own cache.
func another(t *testing.T, nc *nats.Conn, st *store.Store) *store.Store {
	t.Helper()
	b, err := store.Open(context.Background(), nc, store.Config{Stream: st.Stream().CachedInfo().Config.Name, Subjects: st.Subjects()})
	if err != nil {
		t.Error(err)
		return nil
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// released schedules a task and releases it, returning its delivery token.
func released(t *testing.T, st *store.Store) (taskID, token string) {
	t.Helper()
	id := schedule(t, st)
	token = events.NewID()
	if _, _, err := st.Execute(context.Background(), id, "", aggregate.ReleaseDue{DeliveryID: token}); err != nil {
		t.Fatal(err)
	}
	return id, token
}

// countTypes reads the task's log and counts events of type typ.
func countTypes(t *testing.T, st *store.Store, taskID string, typ events.Type) int {
	t.Helper()
	evs, err := st.History(context.Background(), taskID)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Type() == typ {
			n++
		}
	}
	return n
}

func TestRacingClaimsOneWinner(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	// Each racer has its own Store (its own cache), like separate
	// scheduler processes sharing one stream.
	first := setup(t, nc)
	id, token := released(t, first)

	const racers = 32
	var wins, mismatches atomic.Int32
	var g errgroup.Group
	for i := range racers {
		g.Go(func() error {
			st := another(t, nc, first)
			_, _, err := st.Execute(context.Background(), id, "", aggregate.Claim{DeliveryID: token, ExecutorID: fmt.Sprintf("w%d", i)})
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, aggregate.ErrNotClaimable):
				mismatches.Add(1)
			default:
				return err
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if wins.Load() != 1 || mismatches.Load() != racers-1 {
		t.Fatalf("wins=%d not_claimable=%d, want 1 and %d", wins.Load(), mismatches.Load(), racers-1)
	}
	if n := countTypes(t, first, id, events.TypeClaimed); n != 1 {
		t.Fatalf("log has %d Claimed events, want 1", n)
	}
}

func TestClaimRacingCancel(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	a := setup(t, nc)
	b := another(t, nc, a)
	for range 20 {
		id, token := released(t, a)
		// Warm b's cache so both decide on cached state.
		if _, err := b.Load(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		var claimErr, cancelErr error
		var g errgroup.Group
		g.Go(func() error {
			_, _, claimErr = a.Execute(context.Background(), id, "", aggregate.Claim{DeliveryID: token, ExecutorID: "w"})
			return nil
		})
		g.Go(func() error {
			_, _, cancelErr = b.Execute(context.Background(), id, "", aggregate.Cancel{Reason: "race"})
			return nil
		})
		g.Wait()
		// Cancel of a running task is allowed, so both may succeed in the
		// order claim-then-cancel; what must never happen is a claim
		// after the cancel.
		final, err := a.Load(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if final.Status != aggregate.StatusCanceled {
			t.Fatalf("final status %s, want canceled (claim err %v, cancel err %v)", final.Status, claimErr, cancelErr)
		}
		if cancelErr != nil {
			t.Fatalf("cancel failed: %v", cancelErr)
		}
		claimed := countTypes(t, a, id, events.TypeClaimed)
		if (claimErr == nil) != (claimed == 1) {
			t.Fatalf("claim err %v but %d Claimed events", claimErr, claimed)
		}
		if claimErr != nil && !errors.Is(claimErr, aggregate.ErrNotClaimable) {
			t.Fatalf("claim lost with %v, want ErrNotClaimable", claimErr)
		}
		evs, _ := a.History(context.Background(), id)
		if evs[len(evs)-1].Type() != events.TypeCanceled {
			t.Fatalf("last event %s, want Canceled: a claim landed after the cancel", evs[len(evs)-1].Type())
		}
	}
}

// TestRetriedAppendLandsOnce: an append retried after a lost ack carries
// the same expected subject sequence, so the server refuses the copy of
// an attempt that landed (the store then finds its own event: see
// TestCatchUpFindsOwnEvent). On a single server that check is all it
// takes, and appends carry no message id for a dedupe map to keep.
func TestRetriedAppendLandsOnce(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	st := setup(t, nc)
	id := schedule(t, st)
	ctx := context.Background()
	evs, err := st.History(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	data, err := events.Encode(evs[0])
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	_, err = js.Publish(ctx, st.Subjects().Event("acme", id), data, jetstream.WithExpectLastSequencePerSubject(0))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("the retried append: %v, want wrong last sequence", err)
	}
	if got, _ := st.History(ctx, id); len(got) != 1 {
		t.Fatalf("history has %d events, want 1", len(got))
	}
	_, seq := st.Shards().Split(evs[0].Seq)
	msg, err := st.Stream().GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get(jetstream.MsgIDHeader); got != "" {
		t.Errorf("the append carries message id %q on a single server", got)
	}
}

func TestStaleCacheIsCorrectedByOCC(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	a := setup(t, nc)
	b := another(t, nc, a)
	id := schedule(t, a)
	if _, err := b.Load(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	// b caches "scheduled, not released" once it executes something.
	if _, _, err := b.Execute(context.Background(), id, "", aggregate.AppendMail{Message: events.Message{ID: "m1", Content: []events.ContentPart{{Type: "text", Text: "more"}}}}); err != nil {
		t.Fatal(err)
	}
	token := events.NewID()
	if _, _, err := a.Execute(context.Background(), id, "", aggregate.ReleaseDue{DeliveryID: token}); err != nil {
		t.Fatal(err)
	}
	// b's cache says not released; the claim must still succeed after a
	// fresh load rather than answer not_claimable.
	got, _, err := b.Execute(context.Background(), id, "", aggregate.Claim{DeliveryID: token, ExecutorID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != aggregate.StatusRunning || got.Version != 4 {
		t.Fatalf("state %s v%d, want running v4", got.Status, got.Version)
	}
}

// TestConflictsCounted checks that an append refused for a stale expected
// sequence is counted, under its event's type, by the store that made it,
// and only there.
func TestConflictsCounted(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	a := setup(t, nc)
	b := another(t, nc, a)
	id := schedule(t, a)
	mail := func(st *store.Store, msgID string) {
		t.Helper()
		if _, _, err := st.Execute(context.Background(), id, "", aggregate.AppendMail{Message: events.Message{ID: msgID, Content: []events.ContentPart{{Type: "text", Text: msgID}}}}); err != nil {
			t.Fatal(err)
		}
	}
	mail(b, "m1") // b loads the task fresh; a's cached state is now stale
	mailConflicts := func(st *store.Store) uint64 { return st.Conflicts()[events.TypeMailboxAppended] }
	if len(a.Conflicts()) != 0 || len(b.Conflicts()) != 0 {
		t.Fatalf("conflicts a=%v b=%v before any race, want none", a.Conflicts(), b.Conflicts())
	}
	mail(a, "m2") // refused once, caught up, decided again; b's cache is stale now
	if mailConflicts(a) != 1 || len(a.Conflicts()) != 1 || len(b.Conflicts()) != 0 {
		t.Fatalf("conflicts a=%v b=%v, want one MailboxAppended in a and none in b", a.Conflicts(), b.Conflicts())
	}
	mail(b, "m3")
	if mailConflicts(a) != 1 || mailConflicts(b) != 1 {
		t.Fatalf("conflicts a=%v b=%v, want one MailboxAppended in each", a.Conflicts(), b.Conflicts())
	}
	if n := countTypes(t, a, id, events.TypeMailboxAppended); n != 3 {
		t.Fatalf("log has %d MailboxAppended events, want 3", n)
	}
}

func TestLoadMissingTask(t *testing.T) {
	t.Parallel()
	st := setup(t, testnats.Conn(t))
	got, err := st.Load(context.Background(), "nope")
	if err != nil || got.Exists() {
		t.Fatalf("Load = %+v, %v; want zero state", got, err)
	}
	if _, _, err := st.Execute(context.Background(), "nope", "", aggregate.Cancel{}); !errors.Is(err, aggregate.ErrNotFound) {
		t.Fatalf("cancel missing: %v, want ErrNotFound", err)
	}
}

func TestLongHistorySpansBatches(t *testing.T) {
	t.Parallel()
	st := setup(t, testnats.Conn(t))
	id := schedule(t, st)
	const n = 600 // more than one direct-get batch
	for i := range n {
		msg := events.Message{ID: fmt.Sprintf("m%d", i), Content: []events.ContentPart{{Type: "text", Text: "hi"}}}
		if _, _, err := st.Execute(context.Background(), id, "", aggregate.AppendMail{Message: msg}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.Load(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != n+1 || len(got.MailIDs) != n {
		t.Fatalf("version %d, %d messages; want %d, %d", got.Version, len(got.MailIDs), n+1, n)
	}
}

func TestRestartReloadsSameState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ns := testnats.NewNamespace(t)
	open := func() (*broker.Embedded, *nats.Conn, *store.Store) {
		srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		st, err := store.Open(context.Background(), nc, store.Config{Stream: ns.Stream, Subjects: ns.Subjects})
		if err != nil {
			t.Fatal(err)
		}
		return srv, nc, st
	}
	srv, nc, st := open()
	want := map[string]aggregate.State{}
	for i := range 30 {
		id, token := released(t, st)
		switch i % 5 {
		case 1:
			_, _, err := st.Execute(context.Background(), id, "", aggregate.Claim{DeliveryID: token, ExecutorID: "w"})
			if err != nil {
				t.Fatal(err)
			}
		case 2:
			st.Execute(context.Background(), id, "", aggregate.Claim{DeliveryID: token, ExecutorID: "w"})
			st.Execute(context.Background(), id, "w", aggregate.RecordResult{DeliveryID: token, Result: events.Result{Success: true, Summary: "ok"}})
		case 3:
			st.Execute(context.Background(), id, "", aggregate.Cancel{Reason: "bye"})
		case 4:
			st.Execute(context.Background(), id, "", aggregate.MarkReadyPublished{DeliveryID: token})
		}
		s, err := st.Load(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		want[id] = s
	}
	st.Close()
	nc.Close()
	srv.Shutdown()

	srv, nc, st = open()
	defer srv.Shutdown()
	defer nc.Close()
	defer st.Close()
	for id, w := range want {
		got, err := st.Load(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("task %s after restart:\n got %+v\nwant %+v", id, got, w)
		}
	}
}

// TestExecuteSeen: a reactor command refused on a cached state at least as
// new as the caller's view is final; on an older cached state (another
// process moved the task on) it is decided again on a fresh load, so the
// reactor is not told "stale" forever by its own cache.
func TestExecuteSeen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := testnats.Conn(t)
	a := setup(t, nc)
	b := another(t, nc, a)
	id, first := released(t, a)
	if _, _, err := b.Execute(ctx, id, "", aggregate.AppendMail{Message: events.Message{ID: "m1", Content: []events.ContentPart{{Type: "text", Text: "more"}}}}); err != nil {
		t.Fatal(err) // b caches the task with its first token pending
	}
	cached, err := b.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// a claims the first token and releases nothing new: b's cache is
	// behind. A publish record for the first token is stale either way.
	if _, _, err := a.Execute(ctx, id, "", aggregate.Claim{DeliveryID: first, ExecutorID: "w"}); err != nil {
		t.Fatal(err)
	}
	st, _, err := b.ExecuteSeen(ctx, id, "", aggregate.MarkReadyPublished{DeliveryID: "other"}, cached.LastSeq)
	if !errors.Is(err, aggregate.ErrStale) || st.Status == aggregate.StatusRunning {
		t.Fatalf("a command stale on a cache as new as the view: %v on %s; want ErrStale on the cached state, no load", err, st.Status)
	}
	// A view that has seen the claim is newer than b's cache: b must load
	// afresh and decide on the running task.
	st, _, err = b.ExecuteSeen(ctx, id, "", aggregate.MarkReadyPublished{DeliveryID: first}, cached.LastSeq+1)
	if !errors.Is(err, aggregate.ErrStale) {
		t.Fatalf("publish record after the claim: %v", err)
	}
	if st.Status != aggregate.StatusRunning {
		t.Fatalf("decided on %s, want the fresh state (running)", st.Status)
	}
}

// TestPipelineLosesConnection drops the store's connection while many
// appends are in its pipeline: every append answered as done is in the
// log exactly once at the sequence it was answered with, and the store
// appends again once the connection is back.
func TestPipelineLosesConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := testnats.Conn(t, nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1))
	st := setup(t, nc)
	reader := another(t, testnats.Conn(t), st)
	const writers, each = 32, 40
	type acked struct {
		id  string
		seq events.Position
	}
	var mu sync.Mutex
	var done []acked
	started := make(chan struct{})
	var once sync.Once
	var g errgroup.Group
	for range writers {
		g.Go(func() error {
			for range each {
				id := events.NewID()
				s, _, err := st.Execute(ctx, id, "", aggregate.Schedule{TaskID: id, CustomerID: "acme",
					Spec: events.TaskSpec{RootID: id, Queue: "default", TimeoutSeconds: 60}})
				if err != nil {
					continue // unanswered: it may or may not have landed
				}
				mu.Lock()
				done = append(done, acked{id, s.LastSeq})
				if len(done) == writers {
					once.Do(func() { close(started) })
				}
				mu.Unlock()
			}
			return nil
		})
	}
	<-started
	testnats.Disconnect(t, nc)
	g.Wait()
	if nc.Stats().Reconnects == 0 {
		t.Fatal("the connection was never dropped")
	}
	t.Logf("%d of %d appends answered across the drop", len(done), writers*each)
	for _, a := range done {
		evs, err := reader.History(ctx, a.id)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 1 || evs[0].Seq != a.seq || evs[0].Type() != events.TypeTaskScheduled {
			t.Fatalf("task %s answered at seq %d, log has %+v", a.id, a.seq, evs)
		}
	}
	if id := schedule(t, st); countTypes(t, reader, id, events.TypeTaskScheduled) != 1 {
		t.Fatalf("no append after the reconnect")
	}
}

// TestTooLargeEvent: an event the log cannot take fails at once with
// aggregate.ErrTooLarge, naming the limit, never as unavailable (which
// callers retry) and without writing anything. One is
// refused before it is sent, one only by the server because its headers
// push it over.
func TestTooLargeEvent(t *testing.T) {
	t.Parallel()
	const limit = 4096
	ns := testnats.NewNamespace(t)
	st, err := store.Open(context.Background(), testnats.Conn(t), store.Config{Stream: ns.Stream, Subjects: ns.Subjects, MaxEventBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if got := st.MaxEventBytes(); got != limit {
		t.Fatalf("MaxEventBytes = %d, want %d", got, limit)
	}
	now := time.Now().UTC()
	spec := func(id string, text int) events.TaskSpec {
		return events.TaskSpec{RootID: id, Queue: "default", TimeoutSeconds: 60, RunAt: now,
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: string(make([]byte, text))}}}}
	}
	// encoded is the size of the event the store would append.
	encoded := func(id string, text int) int {
		data, err := events.Encode(events.Event{ID: events.NewID(), TaskID: id, CustomerID: "acme", Number: 1, At: now,
			Actor: "scheduler", Data: events.TaskScheduled{Spec: spec(id, text)}})
		if err != nil {
			t.Fatal(err)
		}
		return len(data)
	}
	for _, tt := range []struct {
		name string
		size int // of the encoded event
	}{
		{"OverTheLimit", limit + 1},
		{"HeadersPushItOver", limit - 16},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := events.NewID()
			text := 1000
			text += tt.size - encoded(id, text)
			if got := encoded(id, text); got != tt.size {
				t.Fatalf("encoded size %d, want %d", got, tt.size)
			}
			_, _, err := st.Execute(context.Background(), id, "", aggregate.Schedule{TaskID: id, CustomerID: "acme", Spec: spec(id, text)})
			if !errors.Is(err, aggregate.ErrTooLarge) || errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("Execute = %v, want ErrTooLarge only", err)
			}
			if want := fmt.Sprint(limit); !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not name the limit %s", err, want)
			}
			if s, err := st.Load(context.Background(), id); err != nil || s.Exists() {
				t.Fatalf("Load = %+v, %v; want no task", s, err)
			}
		})
	}
	// A task within the limit is written as usual.
	id := events.NewID()
	if _, _, err := st.Execute(context.Background(), id, "", aggregate.Schedule{TaskID: id, CustomerID: "acme", Spec: spec(id, 1000)}); err != nil {
		t.Fatal(err)
	}
}

func TestAppendsLinkEachEventToItsPredecessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := testnats.Conn(t)
	a := setup(t, nc)
	b := another(t, nc, a) // its own cache: its appends follow a load or a conflict
	id := schedule(t, a)
	mail := func(st *store.Store, msg string) {
		t.Helper()
		if _, _, err := st.Execute(ctx, id, "", aggregate.AppendMail{Message: events.Message{ID: msg, Content: []events.ContentPart{{Type: "text", Text: "more"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	mail(a, "m1") // from a's cache
	mail(b, "m2") // after b's load
	mail(a, "m3") // a's cache is stale: a conflict, a catch-up, a retry
	mail(b, "m4")
	evs, err := a.History(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 5 {
		t.Fatalf("%d events, want 5", len(evs))
	}
	var prev events.Hash
	for _, ev := range evs {
		msg, err := a.Stream().GetMsg(ctx, ev.Seq.Seq(a.Shards()))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Prev != prev {
			t.Fatalf("event %d links to %x, want %x (the stored bytes of event %d)", ev.Number, ev.Prev, prev, ev.Number-1)
		}
		if ev.Hash != events.HashOf(msg.Data) {
			t.Fatalf("event %d read with hash %x, its bytes hash to %x", ev.Number, ev.Hash, events.HashOf(msg.Data))
		}
		prev = ev.Hash
	}
	if st, err := a.Load(ctx, id); err != nil || st.LastHash != prev {
		t.Fatalf("loaded state's LastHash %x, %v; want the last event's %x", st.LastHash, err, prev)
	}
}

func TestWriteErrorUntilAWriteLands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := testnats.Conn(t)
	st := setup(t, nc)
	id := schedule(t, st)
	if err := st.WriteError(); err != nil {
		t.Fatalf("WriteError %v after a write landed", err)
	}
	// The stream refuses to grow (a limit stands in for a full disk):
	// the append fails as unavailable, and the store remembers it.
	js, _ := jetstream.New(nc)
	cfg := st.Stream().CachedInfo().Config
	cfg.MaxBytes, cfg.Discard = 1, jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	mail := aggregate.AppendMail{Message: events.Message{ID: "m1", Content: []events.ContentPart{{Type: "text", Text: "more"}}}}
	if _, _, err := st.Execute(ctx, id, "", mail); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("append to a full stream: %v, want ErrUnavailable", err)
	}
	if err := st.WriteError(); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("WriteError %v after a failed append, want ErrUnavailable", err)
	}
	// A probe writes elsewhere and clears it; the next append lands.
	cfg.MaxBytes = -1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := st.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.WriteError(); err != nil {
		t.Fatalf("WriteError %v after a probe landed", err)
	}
	if _, _, err := st.Execute(ctx, id, "", mail); err != nil {
		t.Fatal(err)
	}
}

// TestScheduleEventsOnTheirSubject: a schedule's events are appended on
// its own subject, where LoadSchedule and its OCC read them.
func TestScheduleEventsOnTheirSubject(t *testing.T) {
	t.Parallel()
	st := setup(t, testnats.Conn(t))
	ctx := context.Background()
	spec := events.ScheduleSpec{Every: "1h", Timezone: "UTC", Overlap: events.OverlapSkip, Catchup: events.CatchupOne,
		Task: events.TaskSpec{Queue: "default", TimeoutSeconds: 60}}
	for _, cmd := range []aggregate.Command{aggregate.CreateSchedule{ID: "s1", CustomerID: "acme", Spec: spec}, aggregate.PauseSchedule{}} {
		if _, _, err := st.ExecuteSchedule(ctx, "acme", "s1", "", cmd); err != nil {
			t.Fatal(err)
		}
	}
	sc, err := st.LoadSchedule(ctx, "acme", "s1")
	if err != nil || !sc.Exists() || !sc.Paused {
		t.Fatalf("loaded %+v, %v", sc, err)
	}
	n := 0
	err = st.Log().Read(ctx, eventlog.ReadOptions{}, func(m eventlog.Message) error {
		if want := st.Subjects().Schedule("acme", "s1"); m.Subject != want {
			t.Errorf("seq %d on %s, want %s", m.Pos, m.Subject, want)
		}
		n++
		return nil
	})
	if err != nil || n != 2 {
		t.Fatalf("read %d events: %v", n, err)
	}
}

// TestExecuteScheduleOn decides on a state the caller holds without
// reading the log: after the schedule's last event it appends, chained to
// it; after an older one (the log moved on) it appends nothing and
// answers ErrConflict.
func TestExecuteScheduleOn(t *testing.T) {
	t.Parallel()
	st := setup(t, testnats.Conn(t))
	ctx := context.Background()
	spec := events.ScheduleSpec{Every: "1h", Timezone: "UTC", Overlap: events.OverlapSkip, Catchup: events.CatchupOne,
		Task: events.TaskSpec{Queue: "default", TimeoutSeconds: 60}}
	created, _, err := st.ExecuteSchedule(ctx, "acme", "s1", "", aggregate.CreateSchedule{ID: "s1", CustomerID: "acme", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	paused, evs, err := st.ExecuteScheduleOn(ctx, created, "", aggregate.PauseSchedule{})
	if err != nil || len(evs) != 1 || evs[0].Prev != created.LastHash || !paused.Paused {
		t.Fatalf("on the last state: %+v %v (%v)", paused, evs, err)
	}
	if _, evs, err := st.ExecuteScheduleOn(ctx, created, "", aggregate.DeleteSchedule{}); !errors.Is(err, aggregate.ErrConflict) || len(evs) != 0 {
		t.Fatalf("on a state the log moved on from: %v (%v), want ErrConflict", evs, err)
	}
	if h, err := st.ScheduleHistory(ctx, "acme", "s1"); err != nil || len(h) != 2 || h[1].Hash != paused.LastHash {
		t.Fatalf("history %d events (%v), want the creation and the pause", len(h), err)
	}
}

// TestFinishedTasksLeaveTheHotCache runs a store whose cache holds 32
// live tasks and 4 finished ones: 16 live tasks stay cached while 40
// others are scheduled and canceled one after another, and a finished
// task that left the cache is still served from the log, as it stands.
func TestFinishedTasksLeaveTheHotCache(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	ns := testnats.NewNamespace(t)
	ctx := context.Background()
	st, err := store.Open(ctx, nc, store.Config{Stream: ns.Stream, Subjects: ns.Subjects, CacheSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var live, done []string
	for range 16 {
		live = append(live, schedule(t, st))
	}
	for range 40 {
		id := schedule(t, st)
		if _, _, err := st.Execute(ctx, id, "", aggregate.Cancel{Reason: "growth"}); err != nil {
			t.Fatal(err)
		}
		done = append(done, id)
	}
	for _, id := range live {
		if where := st.CachedAs(id); where != "live" {
			t.Fatalf("live task %s cached as %q after 40 finished ones, want live", id, where)
		}
	}
	for i, id := range done {
		want := ""
		if i >= len(done)-4 {
			want = "finished"
		}
		if where := st.CachedAs(id); where != want {
			t.Fatalf("finished task %d of %d cached as %q, want %q", i+1, len(done), where, want)
		}
	}
	// The first finished task left the cache: a command on it reads it
	// from the log and decides on the state there.
	first := done[0]
	stored, err := st.Load(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := st.Execute(ctx, first, "", aggregate.Cancel{Reason: "again"})
	if !errors.Is(err, aggregate.ErrTerminal) {
		t.Fatalf("cancel of a canceled task that left the cache: %v, want ErrTerminal", err)
	}
	if got.Status != aggregate.StatusCanceled || got.LastSeq != stored.LastSeq {
		t.Fatalf("served %s at %d, the log holds %s at %d", got.Status, got.LastSeq, stored.Status, stored.LastSeq)
	}
	if _, _, err := st.Execute(ctx, first, "", aggregate.Claim{DeliveryID: "x", ExecutorID: "w"}); !errors.Is(err, aggregate.ErrNotClaimable) {
		t.Fatalf("claim of a finished task that left the cache: %v, want ErrNotClaimable", err)
	}
}
