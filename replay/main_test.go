package replay_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/replay"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// streamState returns the stream's message count and last sequence now.
func streamState(t testing.TB, js jetstream.JetStream, stream string) (msgs, last uint64) {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs, info.State.LastSeq
}

// readAll returns every message of the stream with its event decoded (nil
// Data for an undecodable one).
func readAll(t testing.TB, js jetstream.JetStream, stream string) ([]eventlog.Message, []events.Event) {
	t.Helper()
	var msgs []eventlog.Message
	var evs []events.Event
	err := eventlog.Log{JS: js, Stream: stream}.Read(context.Background(), eventlog.ReadOptions{}, func(m eventlog.Message) error {
		msgs = append(msgs, m)
		ev, err := events.DecodeAt(m.Data, m.Pos)
		if err != nil {
			ev = events.Event{}
		}
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return msgs, evs
}

// logOf reads the namespace's stream.
func logOf(js jetstream.JetStream, ns testnats.Namespace) eventlog.Log {
	return eventlog.Log{JS: js, Stream: ns.Stream, Subjects: ns.Subjects}
}

// verifyLog runs the verifier over the whole log, as `replay verify` does.
func verifyLog(ctx context.Context, log eventlog.Log, progress func(seq, last uint64)) (replay.Report, error) {
	v := replay.NewVerifier(log.Subjects)
	err := log.Read(ctx, eventlog.ReadOptions{Progress: progress}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	})
	return v.Report(), err
}
