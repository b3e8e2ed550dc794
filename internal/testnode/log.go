package testnode

import (
	"context"
	"testing"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/replay"
)

// LogEvents returns every event of st's whole log, decoded, shard after
// shard, each shard in log order. It fails t if the log cannot be read.
func LogEvents(t testing.TB, st *store.Store) []events.Event {
	t.Helper()
	var out []events.Event
	err := st.Log().Events(context.Background(), eventlog.ReadOptions{}, func(ev events.Event) error {
		out = append(out, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Verify runs replay's verifier over st's whole log and returns its
// report. It fails t if the log cannot be read or the report is not
// clean.
func Verify(t testing.TB, st *store.Store) replay.Report {
	t.Helper()
	v := replay.NewVerifier(st.Subjects())
	err := st.Log().Read(context.Background(), eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r := v.Report()
	if !r.Clean() {
		t.Fatalf("replay verify: %+v", r.Violations)
	}
	return r
}
