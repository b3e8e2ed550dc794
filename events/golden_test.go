package events_test

// The golden v1 log guards the promise that a log written today still
// replays after the code changes: testdata/v1-log.msgpack holds encoded
// v1 events, one of every type, written once and committed. This test
// decodes every one and compares it with the Go values below. It must
// keep passing unchanged for as long as any v1 log may exist.
//
// File format: for each event, its length as a 4-byte big-endian integer,
// then the bytes events.Encode wrote.
//
// The fixture is generated once, when it is missing:
//
//	go test ./events -run Golden -update
//
// -update never overwrites an existing fixture: regenerating it would
// throw away the old bytes this test exists to keep reading.
//
// Changing the shape of a payload (say Claimed gains a field whose
// meaning old events must not silently get as its zero value):
//
//  1. Give that type (only that one) version 2 in the codec: Encode writes
//     v2 for it, every other type stays at 1.
//  2. In upcast, add a case for the type at version 1 that decodes the old
//     bytes into the v1 shape (keep that struct, unexported, in the codec)
//     and converts it into the current struct, filling the new field as
//     old events mean it. Version 2 decodes directly.
//  3. Keep this fixture and its expectations as they are, except that the
//     expected value of the changed type becomes the upcast result. Add
//     testdata/v2-log.msgpack with its own expectations if v2 bytes need
//     guarding too.
//
// testdata/v2-log.msgpack holds the same events in the v2 envelope, each
// with prev, the SHA-256 of its task's previous stored event: it guards
// the hash chain's bytes the same way.
//
// Never rename a type, a msgpack key or a JSON field name: they are part
// of the stored log.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
)

var update = flag.Bool("update", false, "write the testdata fixtures that are missing")

const (
	goldenV1 = "testdata/v1-log.msgpack"
	goldenV2 = "testdata/v2-log.msgpack" // the v2 envelope: each event links to its task's previous one
)

// goldenEvents is what the v1 fixture holds, in order.
func goldenEvents() []events.Event {
	at := time.Date(2025, 11, 3, 9, 30, 15, 123456789, time.UTC)
	spec := events.TaskSpec{
		RootID: "root-1", ParentID: "parent-1", RequestID: "req-1", RelatedTaskID: "related-1", Queue: "default",
		Signal: events.Signal{ID: "sig-1", URI: "https://example.com/hooks/1", RequestID: "sig-req-1", EventType: "pull_request", EventAction: "opened"},
		Repo:   "example/repo",
		Message: events.Message{ID: "msg-0", CreatedAt: at.Add(-time.Minute), Content: []events.ContentPart{
			{Type: "text", Text: "fix the flaky test"}, {Type: "text", Text: "ünïcode ✓"},
		}},
		RunAt:          at.Add(time.Hour),
		TimeoutSeconds: 900,
	}
	minimal := events.TaskSpec{RootID: "root-2", Queue: "q", RunAt: at, TimeoutSeconds: 1, Message: events.Message{CreatedAt: at}}
	ev := func(task string, n int, actor string, d time.Duration, p events.Payload) events.Event {
		return events.Event{
			ID: "evt-" + task + "-" + string(rune('a'+n-1)), Version: 1, TaskID: task, CustomerID: "cust-1", Number: n,
			At: at.Add(d), Actor: actor, Data: p,
		}
	}
	return []events.Event{
		ev("task-1", 1, "scheduler-a", 0, events.TaskScheduled{Spec: spec}),
		ev("task-1", 2, "scheduler-a", time.Second, events.DeliveryPending{DeliveryID: "dlv-1", Attempt: 1, NextAt: at.Add(time.Second)}),
		ev("task-1", 3, "scheduler-b", 2*time.Second, events.DeliveryRetryScheduled{DeliveryID: "dlv-1", Attempt: 2, NextAt: at.Add(3 * time.Second), Error: "nats: timeout"}),
		ev("task-1", 4, "scheduler-a", 3*time.Second, events.ReadyPublished{DeliveryID: "dlv-1"}),
		ev("task-1", 5, "exec-7", 4*time.Second, events.Claimed{DeliveryID: "dlv-1", ExecutorID: "exec-7", Deadline: at.Add(4*time.Second + 900*time.Second)}),
		ev("task-1", 6, "scheduler-a", 5*time.Second, events.MailboxAppended{Index: 1, Message: events.Message{
			ID: "child-task-9", CreatedAt: at.Add(5 * time.Second), Content: []events.ContentPart{{Type: "child_result", Text: `{"taskId":"task-9","status":"succeeded"}`}},
		}}),
		ev("task-1", 7, "scheduler-a", 6*time.Second, events.MailboxRead{Cursor: 1}),
		ev("task-1", 8, "exec-7", 7*time.Second, events.ResultRecorded{DeliveryID: "dlv-1", Result: events.Result{
			Success: true, Summary: "opened a pull request", Error: "one comment failed",
			Effects: []events.Effect{
				{Kind: "pull_request", Ref: "#12", URL: "https://example.com/pr/12"},
				{Kind: "comment", Ref: "c-3", URL: "https://example.com/c/3", Uncertain: true},
			},
		}}),
		ev("task-2", 1, "", 8*time.Second, events.AdmissionRejected{Spec: minimal, Reason: "quota: 5 active root tasks, at most 5"}),
		ev("task-3", 1, "scheduler-a", 9*time.Second, events.TaskScheduled{Spec: minimal}),
		ev("task-3", 2, "scheduler-a", 10*time.Second, events.DeliveryPending{DeliveryID: "dlv-3", Attempt: 1, NextAt: at.Add(10 * time.Second)}),
		ev("task-3", 3, "scheduler-a", 11*time.Second, events.DeliveryExhausted{DeliveryID: "dlv-3", Attempts: 8, Reason: "ready notification not published after 8 attempts"}),
		ev("task-4", 1, "scheduler-a", 12*time.Second, events.TaskScheduled{Spec: minimal}),
		ev("task-4", 2, "exec-1", 13*time.Second, events.Claimed{DeliveryID: "dlv-4", ExecutorID: "exec-1", Deadline: at.Add(14 * time.Second)}),
		ev("task-4", 3, "scheduler-a", 14*time.Second, events.TimedOut{Deadline: at.Add(14 * time.Second)}),
		ev("task-5", 1, "scheduler-a", 15*time.Second, events.TaskScheduled{Spec: minimal}),
		ev("task-5", 2, "api", 16*time.Second, events.Canceled{Reason: "user asked"}),
		ev("task-6", 1, "scheduler-a", 17*time.Second, events.TaskScheduled{Spec: minimal}),
		ev("task-6", 2, "", 18*time.Second, events.ResultRecorded{Result: events.Result{}}),
		ev("task-6", 3, "", 19*time.Second, events.Canceled{}),
	}
}

// allV1Types is every v1 event type; the fixture must hold each.
var allV1Types = []events.Type{
	events.TypeTaskScheduled, events.TypeAdmissionRejected, events.TypeDeliveryPending, events.TypeDeliveryRetryScheduled,
	events.TypeDeliveryExhausted, events.TypeReadyPublished, events.TypeClaimed, events.TypeTimedOut,
	events.TypeResultRecorded, events.TypeCanceled, events.TypeMailboxAppended, events.TypeMailboxRead,
}

func writeGolden(t *testing.T, path string, evs []events.Event) {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		t.Fatalf("%s exists and is never regenerated: it is the log this test keeps reading. "+
			"Delete it by hand only if no such log exists anywhere.", path)
	}
	var buf bytes.Buffer
	for _, ev := range evs {
		b, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b))))
		buf.Write(b)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %d events, %d bytes", path, len(evs), buf.Len())
}

// readGolden splits a fixture into encoded events.
func readGolden(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (generate it once with: go test ./events -run Golden -update)", err)
	}
	var out [][]byte
	r := bytes.NewReader(data)
	for {
		var n uint32
		if err := binary.Read(r, binary.BigEndian, &n); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: length prefix of event %d: %v", path, len(out), err)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			t.Fatalf("%s: event %d: %v", path, len(out), err)
		}
		out = append(out, b)
	}
}

func TestGoldenV1LogDecodes(t *testing.T) {
	t.Parallel()
	want := goldenEvents()
	if *update {
		if _, err := os.Stat(goldenV1); err != nil {
			writeGolden(t, goldenV1, want)
		}
	}
	stored := readGolden(t, goldenV1)
	if len(stored) != len(want) {
		t.Fatalf("%s holds %d events, want %d", goldenV1, len(stored), len(want))
	}
	seen := map[events.Type]bool{}
	for i, b := range stored {
		got, err := events.Decode(b)
		if err != nil {
			t.Fatalf("event %d of the v1 log no longer decodes: %v", i, err)
		}
		if got.Version != 1 {
			t.Errorf("event %d: stored version %d, want 1", i, got.Version)
		}
		if g, w := inUTC(got), inUTC(want[i]); !reflect.DeepEqual(g, w) {
			t.Errorf("event %d (%s) decodes to\n%#v\nwant\n%#v", i, want[i].Type(), g, w)
		}
		seen[got.Type()] = true
	}
	for _, typ := range allV1Types {
		if !seen[typ] {
			t.Errorf("%s holds no %s event", goldenV1, typ)
		}
	}
}

// goldenV2Events is the v1 events as the v2 envelope writes them: each
// linked to the stored bytes of its task's previous event, which encode
// deterministically from the values.
func goldenV2Events(t *testing.T) []events.Event {
	t.Helper()
	evs := goldenEvents()
	last := map[string]events.Hash{}
	for i := range evs {
		evs[i].Version, evs[i].Prev = 2, last[evs[i].TaskID]
		b, err := events.Encode(evs[i])
		if err != nil {
			t.Fatal(err)
		}
		last[evs[i].TaskID] = events.HashOf(b)
	}
	return evs
}

func TestGoldenV2LogDecodes(t *testing.T) {
	t.Parallel()
	want := goldenV2Events(t)
	if *update {
		if _, err := os.Stat(goldenV2); err != nil {
			writeGolden(t, goldenV2, want)
		}
	}
	stored := readGolden(t, goldenV2)
	if len(stored) != len(want) {
		t.Fatalf("%s holds %d events, want %d", goldenV2, len(stored), len(want))
	}
	last := map[string]events.Hash{}
	for i, b := range stored {
		got, err := events.DecodeHashed(b, events.Position(i+1))
		if err != nil {
			t.Fatalf("event %d of the v2 log no longer decodes: %v", i, err)
		}
		if got.Prev != last[got.TaskID] {
			t.Errorf("event %d: prev %x, want the stored hash of its task's previous event %x", i, got.Prev, last[got.TaskID])
		}
		last[got.TaskID] = got.Hash
		got.Seq, got.Hash = 0, events.Hash{}
		// The links were checked against the stored bytes above; the
		// expected values' own links would re-encode TaskScheduled at its
		// newer version (v3) and so hash other bytes.
		w := want[i]
		w.Prev = got.Prev
		if g, w := inUTC(got), inUTC(w); !reflect.DeepEqual(g, w) {
			t.Errorf("event %d (%s) decodes to\n%#v\nwant\n%#v", i, want[i].Type(), g, w)
		}
	}
}

// inUTC returns a copy of v with every time.Time in it set to UTC, so a
// decoded value (in time.Local) compares equal to the expected one.
func inUTC[T any](v T) T {
	rv := reflect.New(reflect.TypeOf(&v).Elem()).Elem()
	rv.Set(reflect.ValueOf(v))
	return toUTC(rv).Interface().(T)
}

var timeType = reflect.TypeOf(time.Time{})

// toUTC returns a copy of v with its times in UTC.
func toUTC(v reflect.Value) reflect.Value {
	switch {
	case v.Type() == timeType:
		return reflect.ValueOf(v.Interface().(time.Time).UTC())
	case v.Kind() == reflect.Struct:
		out := reflect.New(v.Type()).Elem()
		for i := range v.NumField() {
			out.Field(i).Set(toUTC(v.Field(i)))
		}
		return out
	case v.Kind() == reflect.Slice && !v.IsNil():
		out := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := range v.Len() {
			out.Index(i).Set(toUTC(v.Index(i)))
		}
		return out
	case v.Kind() == reflect.Interface && !v.IsNil():
		out := reflect.New(v.Type()).Elem()
		out.Set(toUTC(v.Elem()))
		return out
	case v.Kind() == reflect.Pointer && !v.IsNil():
		out := reflect.New(v.Type().Elem())
		out.Elem().Set(toUTC(v.Elem()))
		return out
	}
	return v
}
