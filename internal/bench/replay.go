package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/projections"
)

// fillGroup is how many tasks fill writes at a time. Groups alternate
// between two layouts: interleaved, where the group's tasks take turns so
// a task's events lie about fillGroup*historyLen sequences apart, as they
// do with that many tasks in flight; and contiguous, one task's events
// side by side (the best case for a load).
const fillGroup = 1000

// fill appends about n encoded events, historyLen per task (history),
// with async publishes, and returns the task ids.
func (r *run) fill(ctx context.Context, nc *nats.Conn, subj events.Subjects, n int) ([]string, error) {
	js, err := newAsyncPublisher(nc)
	if err != nil {
		return nil, err
	}
	defer js.CleanupPublisher()

	tasks := max(n/historyLen, 1)
	taskIDs := make([]string, tasks)
	for i := range taskIDs {
		taskIDs[i] = events.NewID()
	}
	total := tasks * historyLen
	at := time.Now()
	start := time.Now()
	published := 0
	for lo := 0; lo < tasks; lo += fillGroup {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hi := min(lo+fillGroup, tasks)
		msgs := make([][]*nats.Msg, hi-lo)
		for i := range msgs {
			id, cust := taskIDs[lo+i], customer(lo+i)
			for _, ev := range history(id, cust, at) {
				data, err := events.Encode(ev)
				if err != nil {
					return nil, err
				}
				msg := &nats.Msg{Subject: subj.Event(cust, id), Data: data, Header: nats.Header{}}
				msg.Header.Set(store.TypeHeader, string(ev.Type()))
				msgs[i] = append(msgs[i], msg)
			}
		}
		interleaved := lo/fillGroup%2 == 0
		for k := range historyLen * len(msgs) {
			msg := msgs[k/historyLen][k%historyLen]
			if interleaved {
				msg = msgs[k%len(msgs)][k/len(msgs)]
			}
			if _, err := js.PublishMsgAsync(msg, jetstream.WithStallWait(time.Minute)); err != nil {
				return nil, fmt.Errorf("async publish: %w", err)
			}
			if published++; published%200000 == 0 {
				r.say("  fill: %d/%d events, %.0f events/s", published, total, float64(published)/time.Since(start).Seconds())
			}
		}
	}
	if err := js.wait(ctx); err != nil {
		return nil, fmt.Errorf("fill: %w", err)
	}
	r.say("  fill (encode included): %d events in %d tasks, %.0f events/s", total, tasks, float64(total)/time.Since(start).Seconds())
	return taskIDs, nil
}

// replay fills a stream of its own with a million events (times the
// scale), then measures reading it raw, rebuilding the projections from
// it, and loading single tasks from it.
func (r *run) replay(ctx context.Context, nc *nats.Conn) error {
	const name = "replay"
	st, err := openStore(ctx, nc, name, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	stream := st.Stream().CachedInfo().Config.Name
	taskIDs, err := r.fill(ctx, nc, st.Subjects(), r.scaled(1_000_000, 5000))
	if err != nil {
		return err
	}
	info, err := st.Stream().Info(ctx)
	if err != nil {
		return err
	}
	if want := uint64(len(taskIDs) * historyLen); info.State.Msgs != want {
		return fmt.Errorf("stream holds %d messages, want %d", info.State.Msgs, want)
	}
	last := info.State.LastSeq

	cpu, start := processCPU(), time.Now()
	readRate, read, err := rawRead(ctx, st.JetStream(), stream, st.Subjects())
	if err != nil {
		return err
	}
	r.sayCPU("raw read", processCPU()-cpu, time.Since(start), read, "event")
	if uint64(read) != last {
		return fmt.Errorf("raw read: %d events, want %d", read, last)
	}

	// Every task is finished here; the projections keep them all, so
	// each event's fold is measured and loads find every customer.
	eng, err := projections.New(projections.Config{Log: st.Log(), Logger: discardLogger, Retain: keepAll})
	if err != nil {
		return err
	}
	cpu, start = processCPU(), time.Now()
	if err := eng.RebuildTo(ctx, []events.Position{events.Position(last)}, nil); err != nil {
		return err
	}
	rebuildRate := float64(last) / time.Since(start).Seconds()
	r.sayCPU("rebuild", processCPU()-cpu, time.Since(start), int(last), "event")
	if got := eng.QueueCounts()["default"][aggregate.StatusSucceeded]; got != len(taskIDs) {
		return fmt.Errorf("rebuilt projections hold %d succeeded tasks, want %d", got, len(taskIDs))
	}
	r.say("  %d events: raw read %.2fs, rebuild %.2fs", last, float64(last)/readRate, float64(last)/rebuildRate)
	r.add(atLeast(Figure{Section: "replay", Name: FigRebuild, Value: rebuildRate, Unit: "events/s",
		Ratio: rebuildRate / readRate, RatioOf: ratioRead}, rebuildRate/readRate, 0.7, "≥ 0.70× raw read"))
	r.add(Figure{Section: "replay", Name: FigReplayRead, Value: readRate, Unit: "events/s"})
	if err := r.startup(ctx, eng, st, stream); err != nil {
		return err
	}

	// Loads as a node makes them: the projections tell the store the
	// task's customer, so it reads the task's own subject.
	ld, err := openStore(ctx, nc, name, func(id string) (string, string, events.Position, bool) {
		t, ok := eng.Task(id)
		return t.CustomerID, t.Spec.RootID, t.FirstSeq, ok
	})
	if err != nil {
		return err
	}
	defer ld.Close()
	loads := r.scaled(2000, 200)
	rng := rand.New(rand.NewPCG(1, 2))
	lat := make([]time.Duration, loads)
	for i := range lat {
		id := taskIDs[rng.IntN(len(taskIDs))]
		t0 := time.Now()
		s, err := ld.Load(ctx, id)
		lat[i] = time.Since(t0)
		if err != nil {
			return err
		}
		if s.Version != historyLen || s.Status != aggregate.StatusSucceeded {
			return fmt.Errorf("task %s: version %d status %s, want %d events and succeeded", id, s.Version, s.Status, historyLen)
		}
	}
	slices.Sort(lat)
	r.say("  %d loads of a %d-event task from the %d-event stream", loads, historyLen, last)
	r.add(r.rttRatio(Figure{Section: "replay", Name: FigLoadP50, Value: millis(percentile(lat, .5)), Unit: "ms"}))
	p99 := millis(percentile(lat, .99))
	r.add(atMost(r.rttRatio(Figure{Section: "replay", Name: FigLoadP99, Value: p99, Unit: "ms"}), p99, 2, "≤ 2 ms"))
	return nil
}

// keepAll is projections.Config.Retain that evicts nothing.
const keepAll = -1

// startup measures how long a scheduler's projections take to catch up
// with the filled stream on start: without a snapshot (replaying every
// event) and from a snapshot written by eng.
func (r *run) startup(ctx context.Context, eng *projections.Engine, st *store.Store, stream string) error {
	snaps := &projections.MemorySnapshots{}
	writer, err := projections.New(projections.Config{Log: st.Log(), Logger: discardLogger, Snapshots: snaps, Retain: keepAll})
	if err != nil {
		return err
	}
	if err := writer.RebuildTo(ctx, eng.Positions(), nil); err != nil {
		return err
	}
	if err := writer.SaveSnapshot(ctx); err != nil {
		return err
	}
	data, _, _ := snaps.Load(ctx)
	r.say("  snapshot of %d events: %d bytes", eng.Applied(), len(data))
	for _, c := range []struct {
		name  string
		snaps projections.SnapshotStore
	}{{FigStartCold, nil}, {FigStartSnapshot, snaps}} {
		e, err := projections.New(projections.Config{Log: st.Log(), Logger: discardLogger, Snapshots: c.snaps, Retain: keepAll})
		if err != nil {
			return err
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- e.Run(runCtx) }()
		select {
		case err := <-done:
			cancel()
			return fmt.Errorf("%s: engine stopped: %v", c.name, err)
		case <-e.Ready():
		}
		took := time.Since(start)
		cancel()
		<-done
		if e.Digest() != eng.Digest() {
			return fmt.Errorf("%s: projections differ from the rebuilt ones", c.name)
		}
		r.add(Figure{Section: "replay", Name: c.name, Value: took.Seconds(), Unit: "s"})
	}
	return nil
}
