package events

import (
	"bytes"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// base is the fixed time every test event is built from.
var base = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)

func sampleSpec() TaskSpec {
	return TaskSpec{
		RootID:        "root-1",
		ParentID:      "parent-1",
		RequestID:     "req-1",
		RelatedTaskID: "related-1",
		Queue:         "default",
		Signal: Signal{
			ID:          "sig-1",
			URI:         "https://example.com/hooks/1",
			RequestID:   "sig-req-1",
			EventType:   "pull_request",
			EventAction: "opened",
		},
		Repo: "example/repo",
		Message: Message{
			ID:        "msg-0",
			CreatedAt: base.Add(-time.Minute),
			Content:   []ContentPart{{Type: "text", Text: "fix the flaky test"}, {Type: "text", Text: "ünïcode ✓"}},
		},
		RunAt:          base.Add(time.Hour),
		TimeoutSeconds: 900,
		Labels:         map[string]string{"repo": "example/repo", "team": "ünïcode", "a.b/c-d_e": ""},
		RetryOf:        "related-1",
		Kind:           "image.resize",
		Payload:        []byte(`{"src":"s3://b/k.png","width":640,"tags":["ünï",null]}`),
	}
}

// samplePayloads returns one payload of every type with every field set.
func samplePayloads() []Payload {
	return []Payload{
		TaskScheduled{Spec: sampleSpec(), DeliveryID: "dlv-0", NextAt: base.Add(time.Second)},
		AdmissionRejected{Spec: sampleSpec(), Reason: "quota exceeded"},
		DeliveryPending{DeliveryID: "dlv-1", Attempt: 1, NextAt: base.Add(2 * time.Second)},
		DeliveryRetryScheduled{DeliveryID: "dlv-1", Attempt: 3, NextAt: base.Add(8 * time.Second), Error: "nats: timeout"},
		DeliveryExhausted{DeliveryID: "dlv-1", Attempts: 5, Reason: "publish failed"},
		ReadyPublished{DeliveryID: "dlv-1", ReadySeq: 7},
		ReadyRepublished{DeliveryID: "dlv-1", LostSeq: 7, ReadySeq: 42},
		Claimed{DeliveryID: "dlv-1", ExecutorID: "exec-7", Deadline: base.Add(15 * time.Minute), HeartbeatSeconds: 30},
		ClaimLost{DeliveryID: "dlv-1", ExecutorID: "exec-7", Reason: ClaimLostReleased, Note: "shutting down", Attempt: 2},
		TimedOut{Deadline: base.Add(15 * time.Minute)},
		ResultRecorded{DeliveryID: "dlv-1", Result: Result{
			Success: true,
			Summary: "opened a pull request",
			Error:   "partial: one comment failed",
			Effects: []Effect{
				{Kind: "pull_request", Ref: "#12", URL: "https://example.com/pr/12", Uncertain: false},
				{Kind: "comment", Ref: "c-3", URL: "https://example.com/c/3", Uncertain: true, At: base.Add(time.Minute)},
			},
			Output: []byte(`{"pr":12,"files":["a.go"]}`),
		}},
		Canceled{Reason: "user asked"},
		MailboxAppended{Index: 4, Message: Message{
			ID:        "msg-4",
			CreatedAt: base.Add(3 * time.Minute),
			Content:   []ContentPart{{Type: "text", Text: "also update the docs"}},
		}},
		MailboxRead{Cursor: 4},
		EffectsReported{DeliveryID: "dlv-1", Effects: []Effect{
			{Kind: "pull_request", Ref: "#12", URL: "https://example.com/pr/12", Uncertain: true, At: base.Add(time.Minute)},
		}},
		CheckFailed{Since: base.Add(2 * time.Minute), Failures: 3, Error: "load task: timeout"},
		RunSaved{DeliveryID: "dlv-1", Revision: 3, Digest: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", Size: 41},
	}
}

// allTypes lists every v1 type; samplePayloads must cover each.
var allTypes = []Type{
	TypeTaskScheduled, TypeAdmissionRejected, TypeDeliveryPending, TypeDeliveryRetryScheduled,
	TypeDeliveryExhausted, TypeReadyPublished, TypeReadyRepublished, TypeClaimed, TypeClaimLost, TypeTimedOut,
	TypeResultRecorded, TypeCanceled, TypeMailboxAppended, TypeMailboxRead, TypeEffectsReported,
	TypeCheckFailed,
	TypeRunSaved,
}

func sampleEvent(p Payload) Event {
	return Event{
		ID:         "evt-" + string(p.EventType()),
		TaskID:     "task-1",
		CustomerID: "cust_1",
		Number:     1,
		At:         base,
		Actor:      "node-a",
		Data:       p,
	}
}

// utc returns ev with its time and every time in its payload in UTC, so
// reflect.DeepEqual compares instants rather than locations.
func utc(ev Event) Event {
	ev.At = ev.At.UTC()
	spec := func(s TaskSpec) TaskSpec {
		s.RunAt = s.RunAt.UTC()
		s.Message.CreatedAt = s.Message.CreatedAt.UTC()
		return s
	}
	switch p := ev.Data.(type) {
	case TaskScheduled:
		p.Spec, p.NextAt = spec(p.Spec), p.NextAt.UTC()
		ev.Data = p
	case AdmissionRejected:
		p.Spec = spec(p.Spec)
		ev.Data = p
	case DeliveryPending:
		p.NextAt = p.NextAt.UTC()
		ev.Data = p
	case DeliveryRetryScheduled:
		p.NextAt = p.NextAt.UTC()
		ev.Data = p
	case Claimed:
		p.Deadline = p.Deadline.UTC()
		ev.Data = p
	case TimedOut:
		p.Deadline = p.Deadline.UTC()
		ev.Data = p
	case MailboxAppended:
		p.Message.CreatedAt = p.Message.CreatedAt.UTC()
		ev.Data = p
	case ResultRecorded:
		p.Result.Effects = utcEffects(p.Result.Effects)
		ev.Data = p
	case EffectsReported:
		p.Effects = utcEffects(p.Effects)
		ev.Data = p
	case CheckFailed:
		p.Since = p.Since.UTC()
		ev.Data = p
	}
	return ev
}

func utcEffects(es []Effect) []Effect {
	if es == nil {
		return nil
	}
	out := make([]Effect, len(es))
	for i, e := range es {
		e.At = e.At.UTC()
		out[i] = e
	}
	return out
}

func mustEncode(t testing.TB, ev Event) []byte {
	t.Helper()
	b, err := Encode(ev)
	if err != nil {
		t.Fatalf("Encode(%s): %v", ev.Type(), err)
	}
	return b
}

// rawEnvelope encodes w with msgpack exactly as the log stores it, for
// crafting envelopes Encode would never write.
func rawEnvelope(t testing.TB, w wire) []byte {
	t.Helper()
	b, err := msgpack.Marshal(w)
	if err != nil {
		t.Fatalf("marshal envelope: %v", err)
	}
	return b
}

func rawPayload(t testing.TB, v any) msgpack.RawMessage {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatalf("marshal payload: %v", err)
	}
	return b
}

func validWire(t testing.TB) wire {
	return wire{
		ID:         "evt-1",
		Type:       TypeReadyPublished,
		Version:    currentVersion,
		TaskID:     "task-1",
		CustomerID: "cust-1", Number: 1,
		At:    base,
		Actor: "node-a",
		Data:  payload{raw: rawPayload(t, map[string]any{"deliveryId": "dlv-1"})},
	}
}

func TestSamplePayloadsCoverEveryType(t *testing.T) {
	t.Parallel()
	var got []Type
	for _, p := range samplePayloads() {
		got = append(got, p.EventType())
	}
	if !slices.Equal(got, allTypes) {
		t.Fatalf("sample types = %v, want %v", got, allTypes)
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, p := range samplePayloads() {
		t.Run(string(p.EventType()), func(t *testing.T) {
			t.Parallel()
			in := sampleEvent(p)
			in.Seq = 99 // not part of the encoding
			b := mustEncode(t, in)
			got, err := Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			want := in
			want.Version = uint8(versionOf(p.EventType()))
			want.Seq = 0
			if got, want := utc(got), utc(want); !reflect.DeepEqual(got, want) {
				t.Fatalf("round trip mismatch\n got: %#v\nwant: %#v", got, want)
			}
			if got.Type() != p.EventType() {
				t.Fatalf("Type() = %s, want %s", got.Type(), p.EventType())
			}
		})
	}
}

// TestEncodeLabelsDeterministic: a spec's labels encode in key order, so
// one spec always has the same bytes, and a spec without labels or
// retryOf has the bytes it had before those fields existed.
func TestEncodeLabelsDeterministic(t *testing.T) {
	t.Parallel()
	in := sampleEvent(TaskScheduled{Spec: sampleSpec()})
	first := mustEncode(t, in)
	for range 20 {
		if b := mustEncode(t, in); !bytes.Equal(b, first) {
			t.Fatal("the same spec encoded to different bytes")
		}
	}
	bare := sampleSpec()
	bare.Labels, bare.RetryOf, bare.Kind, bare.Payload = nil, "", "", nil
	b := mustEncode(t, sampleEvent(TaskScheduled{Spec: bare}))
	for _, key := range []string{"labels", "retryOf", "kind", "payload"} {
		if bytes.Contains(b, []byte(key)) {
			t.Fatalf("a spec without %s stores the key", key)
		}
	}
}

func TestEncodeDecodeZeroOptionalFields(t *testing.T) {
	t.Parallel()
	in := Event{TaskID: "t", CustomerID: "c", Number: 1, Data: Canceled{}}
	got, err := Decode(mustEncode(t, in))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	in.Version = currentVersion
	if got, want := utc(got), utc(in); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
}

func TestEncodeStoresInstantNotZone(t *testing.T) {
	t.Parallel()
	in := sampleEvent(DeliveryPending{DeliveryID: "d", Attempt: 1, NextAt: base})
	in.At = base.In(time.FixedZone("UTC+5", 5*3600))
	got, err := Decode(mustEncode(t, in))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !got.At.Equal(base) {
		t.Fatalf("At = %v, want %v", got.At, base)
	}
}

// TestTaskScheduledVersion: TaskScheduled alone is written at v3 (its
// release fields), an unreleased one leaves them out, and v4 is unknown.
func TestTaskScheduledVersion(t *testing.T) {
	t.Parallel()
	b := mustEncode(t, sampleEvent(TaskScheduled{Spec: sampleSpec()}))
	var env map[string]any
	if err := msgpack.Unmarshal(b, &env); err != nil {
		t.Fatal(err)
	}
	if v := env["v"]; v != uint8(3) {
		t.Fatalf("TaskScheduled written at version %v (%T), want 3", v, v)
	}
	data := env["data"].(map[string]any)
	if _, ok := data["deliveryId"]; ok {
		t.Fatalf("an unreleased TaskScheduled writes deliveryId: %v", data)
	}
	if _, ok := data["nextAt"]; ok {
		t.Fatalf("an unreleased TaskScheduled writes nextAt: %v", data)
	}
	w := validWire(t)
	w.Type, w.Version = TypeTaskScheduled, 4
	w.Data = payload{raw: rawPayload(t, map[string]any{"spec": map[string]any{"rootId": "r"}})}
	if _, err := Decode(rawEnvelope(t, w)); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("TaskScheduled v4: %v, want ErrUnknownVersion", err)
	}
	w.Version = 2
	ev, err := Decode(rawEnvelope(t, w))
	if err != nil {
		t.Fatalf("TaskScheduled v2: %v", err)
	}
	if p := ev.Data.(TaskScheduled); p.DeliveryID != "" || !p.NextAt.IsZero() {
		t.Fatalf("TaskScheduled v2 decodes released: %+v", p)
	}
}

func TestEncodeIgnoresEventVersion(t *testing.T) {
	t.Parallel()
	in := sampleEvent(MailboxRead{Cursor: 1})
	in.Version = 7
	got, err := Decode(mustEncode(t, in))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if got.Version != currentVersion {
		t.Fatalf("Version = %d, want %d", got.Version, currentVersion)
	}
}

// TestEncodeWireFormat pins the stored field names: they are the log format.
func TestEncodeWireFormat(t *testing.T) {
	t.Parallel()
	b := mustEncode(t, sampleEvent(DeliveryPending{DeliveryID: "d", Attempt: 2, NextAt: base}))
	var env map[string]any
	if err := msgpack.Unmarshal(b, &env); err != nil {
		t.Fatalf("unmarshal envelope: %v", err)
	}
	assertKeys(t, env, "id", "t", "v", "task", "cust", "n", "at", "actor", "data")
	if env["t"] != string(TypeDeliveryPending) {
		t.Fatalf("t = %v, want %s", env["t"], TypeDeliveryPending)
	}
	data, ok := env["data"].(map[string]any)
	if !ok {
		t.Fatalf("data = %T, want a map", env["data"])
	}
	assertKeys(t, data, "deliveryId", "attempt", "nextAt")
}

func assertKeys(t *testing.T, m map[string]any, want ...string) {
	t.Helper()
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("keys = %v, want %v", got, want)
	}
}

func TestEncodeErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		ev        Event
		invalidID bool
	}{
		{name: "NoPayload", ev: Event{TaskID: "t", CustomerID: "c"}},
		{name: "EmptyTaskID", ev: Event{CustomerID: "c", Number: 1, Data: Canceled{}}, invalidID: true},
		{name: "DotInTaskID", ev: Event{TaskID: "a.b", CustomerID: "c", Number: 1, Data: Canceled{}}, invalidID: true},
		{name: "WildcardCustomerID", ev: Event{TaskID: "t", CustomerID: "*", Data: Canceled{}}, invalidID: true},
		{name: "TailCustomerID", ev: Event{TaskID: "t", CustomerID: ">", Data: Canceled{}}, invalidID: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, err := Encode(tt.ev)
			if err == nil {
				t.Fatalf("Encode = %x, want an error", b)
			}
			if got := errors.Is(err, ErrInvalidID); got != tt.invalidID {
				t.Fatalf("errors.Is(%v, ErrInvalidID) = %v, want %v", err, got, tt.invalidID)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	valid := mustEncode(t, sampleEvent(ReadyPublished{DeliveryID: "dlv-1"}))
	withWire := func(f func(*wire)) func(t *testing.T) []byte {
		return func(t *testing.T) []byte {
			w := validWire(t)
			f(&w)
			return rawEnvelope(t, w)
		}
	}
	bytesOf := func(b []byte) func(*testing.T) []byte {
		return func(*testing.T) []byte { return b }
	}
	mapEnvelope := func(change map[string]any) func(t *testing.T) []byte {
		return func(t *testing.T) []byte {
			m := map[string]any{
				"id": "evt-1", "t": string(TypeReadyPublished), "v": 1, "task": "task-1", "cust": "cust-1",
				"at": base, "data": rawPayload(t, map[string]any{"deliveryId": "dlv-1"}),
			}
			for k, v := range change {
				m[k] = v
			}
			return rawPayload(t, m)
		}
	}
	tests := []struct {
		name  string
		input func(t *testing.T) []byte
		want  error
	}{
		{"Nil", bytesOf(nil), ErrMalformed},
		{"Empty", bytesOf([]byte{}), ErrMalformed},
		{"Text", bytesOf([]byte("definitely not msgpack")), ErrMalformed},
		{"NeverUsedCode", bytesOf([]byte{0xc1}), ErrMalformed},
		{"MsgpackString", bytesOf([]byte{0xa3, 'a', 'b', 'c'}), ErrMalformed},
		{"MsgpackInt", bytesOf([]byte{0x07}), ErrMalformed},
		{"MsgpackNil", bytesOf([]byte{0xc0}), ErrMalformed},
		{"EmptyMap", bytesOf([]byte{0x80}), ErrMalformed},
		{"TrailingByte", bytesOf(append(slices.Clone(valid), 0x00)), ErrMalformed},
		{"TwoEvents", bytesOf(append(slices.Clone(valid), valid...)), ErrMalformed},
		{"UnknownType", withWire(func(w *wire) { w.Type = "TaskExploded" }), ErrUnknownType},
		{"EmptyType", withWire(func(w *wire) { w.Type = "" }), ErrUnknownType},
		{"TypeCaseMatters", withWire(func(w *wire) { w.Type = "readypublished" }), ErrUnknownType},
		{"VersionZero", withWire(func(w *wire) { w.Version = 0 }), ErrUnknownVersion},
		{"VersionThree", withWire(func(w *wire) { w.Version = 3 }), ErrUnknownVersion},
		{"VersionMax", withWire(func(w *wire) { w.Version = 255 }), ErrUnknownVersion},
		{"VersionMissing", mapEnvelope(map[string]any{"v": nil}), ErrUnknownVersion},
		{"Version257", mapEnvelope(map[string]any{"v": 257}), ErrUnknownVersion},
		{"VersionNegative", mapEnvelope(map[string]any{"v": -255}), ErrUnknownVersion},
		{"UnknownTypeVersionThree", withWire(func(w *wire) { w.Type, w.Version = "TaskExploded", 3 }), ErrUnknownVersion},
		{"ShortPrev", withWire(func(w *wire) { w.Prev = []byte{1, 2, 3} }), ErrMalformed},
		{"LongPrev", withWire(func(w *wire) { w.Prev = make([]byte, 33) }), ErrMalformed},
		{"EmptyTaskID", withWire(func(w *wire) { w.TaskID = "" }), ErrMalformed},
		{"DotInTaskID", withWire(func(w *wire) { w.TaskID = "a.b" }), ErrMalformed},
		{"WildcardTaskID", withWire(func(w *wire) { w.TaskID = "*" }), ErrMalformed},
		{"LongTaskID", withWire(func(w *wire) { w.TaskID = strings.Repeat("a", 65) }), ErrMalformed},
		{"TailCustomerID", withWire(func(w *wire) { w.CustomerID = ">" }), ErrMalformed},
		{"EmptyCustomerID", withWire(func(w *wire) { w.CustomerID = "" }), ErrMalformed},
		{"SpaceCustomerID", withWire(func(w *wire) { w.CustomerID = "a b" }), ErrMalformed},
		{"MissingData", withWire(func(w *wire) { w.Data = payload{} }), ErrMalformed},
		{"PayloadNotAMap", withWire(func(w *wire) { w.Data = payload{raw: rawPayload(t, "x")} }), ErrMalformed},
		{"PayloadWrongFieldType", withWire(func(w *wire) {
			w.Type = TypeDeliveryPending
			w.Data = payload{raw: rawPayload(t, map[string]any{"deliveryId": "d", "attempt": "one"})}
		}), ErrMalformed},
		{"EnvelopeWrongFieldType", mapEnvelope(map[string]any{"task": 42}), ErrMalformed},
		{"EnvelopeBadTime", mapEnvelope(map[string]any{"at": "yesterday"}), ErrMalformed},
		// msgpack v5.4.1 panics decoding nil into a time.Time.
		{"NilTimeOnly", bytesOf([]byte("\x88\xa2at\xc0")), ErrMalformed},
		{"EnvelopeNilTime", mapEnvelope(map[string]any{"at": nil}), ErrMalformed},
		{"PayloadNilTime", withWire(func(w *wire) {
			w.Type = TypeClaimed
			w.Data = payload{raw: rawPayload(t, map[string]any{"deliveryId": "d", "executorId": "e", "deadline": nil})}
		}), ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := tt.input(t)
			ev, err := Decode(b)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decode(%x) = %+v, %v; want an error wrapping %v", b, ev, err, tt.want)
			}
			if !reflect.DeepEqual(ev, Event{}) {
				t.Fatalf("Decode returned %+v with its error, want the zero Event", ev)
			}
		})
	}
}

func TestDecodeTruncated(t *testing.T) {
	t.Parallel()
	for _, p := range samplePayloads() {
		t.Run(string(p.EventType()), func(t *testing.T) {
			t.Parallel()
			b := mustEncode(t, sampleEvent(p))
			for n := range len(b) {
				if _, err := Decode(b[:n]); !errors.Is(err, ErrMalformed) {
					t.Fatalf("Decode(first %d of %d bytes) error = %v, want ErrMalformed", n, len(b), err)
				}
			}
		})
	}
}

func TestDecodeCraftedEnvelope(t *testing.T) {
	t.Parallel()
	// An envelope written by another encoder with the same field names
	// decodes; the actor may be absent.
	w := validWire(t)
	w.Actor = ""
	got, err := Decode(rawEnvelope(t, w))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	want := Event{ID: "evt-1", Version: currentVersion, TaskID: "task-1", CustomerID: "cust-1", Number: 1, At: base, Data: ReadyPublished{DeliveryID: "dlv-1"}}
	if got, want := utc(got), utc(want); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
}

func TestValidID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		id   string
		ok   bool
	}{
		{"Empty", "", false},
		{"OneChar", "a", true},
		{"Max64", strings.Repeat("x", 64), true},
		{"Over64", strings.Repeat("x", 65), false},
		{"AllClasses", "AZaz09_-", true},
		{"Underscore", "_", true},
		{"Dash", "-", true},
		{"Dot", "a.b", false},
		{"Star", "*", false},
		{"Tail", ">", false},
		{"Space", "a b", false},
		{"Tab", "a\tb", false},
		{"Newline", "a\n", false},
		{"Slash", "a/b", false},
		{"Colon", "a:b", false},
		{"NUL", "a\x00", false},
		{"Unicode", "tâche", false},
		{"UnicodeDigit", "٣", false},
		{"InvalidUTF8", "\xff", false},
		{"MultibyteWithin64Bytes", strings.Repeat("é", 10), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := ValidID(tt.id)
			if tt.ok && err != nil {
				t.Fatalf("ValidID(%q) = %v, want nil", tt.id, err)
			}
			if !tt.ok && !errors.Is(err, ErrInvalidID) {
				t.Fatalf("ValidID(%q) = %v, want ErrInvalidID", tt.id, err)
			}
		})
	}
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	custom := Subjects{Root: "test42"}
	tests := []struct {
		name, got, want string
	}{
		{"DefaultRoot", DefaultSubjects.Root, "tl"},
		{"Event", DefaultSubjects.Event("cust-1", "task_1"), "tl.evt.cust-1.task_1"},
		{"Task", DefaultSubjects.Task("task_1"), "tl.evt.*.task_1"},
		{"Customer", DefaultSubjects.Customer("cust-1"), "tl.evt.cust-1.>"},
		{"Events", DefaultSubjects.Events(), "tl.evt.>"},
		{"Ready", DefaultSubjects.Ready("gpu"), "tl.ready.gpu"},
		{"AllReady", DefaultSubjects.AllReady(), "tl.ready.>"},
		{"CustomEvent", custom.Event("c", "t"), "test42.evt.c.t"},
		{"CustomTask", custom.Task("t"), "test42.evt.*.t"},
		{"CustomCustomer", custom.Customer("c"), "test42.evt.c.>"},
		{"CustomEvents", custom.Events(), "test42.evt.>"},
		{"CustomReady", custom.Ready("q"), "test42.ready.q"},
		{"CustomAllReady", custom.AllReady(), "test42.ready.>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.got != tt.want {
				t.Fatalf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

// TestSubjectsOfValidIDs checks the property ValidID exists for: a valid
// id is exactly one subject token and never a wildcard.
func TestSubjectsOfValidIDs(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"a", "A-b_9", strings.Repeat("z", MaxIDLen)} {
		subj := DefaultSubjects.Event(id, id)
		tokens := strings.Split(subj, ".")
		if len(tokens) != 4 || tokens[2] != id || tokens[3] != id {
			t.Fatalf("Event(%q, %q) = %q, want 4 tokens ending in the ids", id, id, subj)
		}
		if strings.ContainsAny(subj, "*> ") {
			t.Fatalf("Event(%q, %q) = %q has a wildcard or space", id, id, subj)
		}
	}
}

func TestPrevHashRoundTrip(t *testing.T) {
	t.Parallel()
	first := sampleEvent(ReadyPublished{DeliveryID: "dlv-1"})
	b := mustEncode(t, first)
	second := first
	second.Number, second.Prev = 2, HashOf(b)
	got, err := DecodeHashed(mustEncode(t, second), 9)
	if err != nil {
		t.Fatal(err)
	}
	if got.Prev != HashOf(b) || got.Seq != 9 || got.Hash != HashOf(mustEncode(t, second)) {
		t.Fatalf("prev %x seq %d hash %x: the link, the sequence or the event's own hash was lost", got.Prev, got.Seq, got.Hash)
	}
	// The first event of a chain stores no prev at all.
	if bytes.Contains(b, []byte("prev")) {
		t.Fatal("an event without a previous one encodes a prev key")
	}
}

func TestDecodeV1AcceptsNoPrev(t *testing.T) {
	t.Parallel()
	w := validWire(t)
	w.Version, w.Number = 1, 5
	got, err := Decode(rawEnvelope(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 1 || !got.Prev.IsZero() {
		t.Fatalf("v1 event decoded as version %d with prev %x", got.Version, got.Prev)
	}
}

// An effect without a time is stored as before effects had one, so the
// hash of a result logged by an older build is what this build writes.
func TestEffectZeroAtIsNotStored(t *testing.T) {
	t.Parallel()
	e := encoders.Get().(*encoder)
	defer encoders.Put(e)
	for _, tc := range []struct {
		effect Effect
		keys   []string
	}{
		{Effect{Kind: "comment", Ref: "c-1"}, []string{"kind", "ref"}},
		{Effect{Kind: "comment", At: base}, []string{"at", "kind"}},
	} {
		b, err := e.marshal(nil, tc.effect)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := msgpack.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if keys := slices.Sorted(maps.Keys(m)); !slices.Equal(keys, tc.keys) {
			t.Fatalf("%+v is stored with keys %v, want %v", tc.effect, keys, tc.keys)
		}
	}
}

func TestTaskSubject(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		subject, customer, task string
		ok                      bool
	}{
		{"tl.evt.acme.t1", "acme", "t1", true},
		{"tl.3.evt.acme.t1", "acme", "t1", true},
		{"tl.conc.acme.k1", "", "", false},
		{"tl.evt.acme", "", "", false},
		{"tl.evt.acme.t*", "", "", false},
		{"tl.evt.*.t1", "", "t1", true},
		{"tl.evt.>", "", "", false},
		{"", "", "", false},
	} {
		customer, task, ok := TaskSubject(c.subject)
		if customer != c.customer || task != c.task || ok != c.ok {
			t.Errorf("TaskSubject(%q) = %q %q %v, want %q %q %v", c.subject, customer, task, ok, c.customer, c.task, c.ok)
		}
	}
}
