package projections

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// TestListSearch: label, kind, task id and creation-time filters, alone
// and with the others (an id prefix too), paging through a label's tasks,
// and the kind index kept by a snapshot.
func TestListSearch(t *testing.T) {
	t.Parallel()
	e, _ := New(Config{Retain: -1})
	at := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	seq := uint64(0)
	add := func(task, cust string, p events.Payload) { // each task's first and only event
		t.Helper()
		seq++
		b, err := events.Encode(events.Event{ID: task + "-" + string(p.EventType()), TaskID: task, CustomerID: cust, Number: 1, At: at.Add(time.Duration(seq) * time.Second), Data: p})
		if err != nil {
			t.Fatal(err)
		}
		e.Apply(events.Position(seq), b)
	}
	spec := func(id string, kv ...string) events.TaskSpec {
		s := events.TaskSpec{RootID: id, Queue: "q", RunAt: at.Add(time.Hour), TimeoutSeconds: 60}
		if len(kv) > 0 {
			s.Labels = map[string]string{}
			for i := 0; i+1 < len(kv); i += 2 {
				s.Labels[kv[i]] = kv[i+1]
			}
		}
		return s
	}
	kind := func(s events.TaskSpec, k string) events.TaskSpec {
		s.Kind, s.Payload = k, []byte(`{"w":1}`)
		return s
	}
	add("t1", "a", events.TaskScheduled{Spec: kind(spec("t1", "repo", "x", "team", "red"), "resize")}) // created at+1s
	add("t2", "a", events.TaskScheduled{Spec: spec("t2", "repo", "x")})                                // at+2s
	add("t3", "a", events.TaskScheduled{Spec: kind(spec("t3"), "thumb")})                              // at+3s
	add("t4", "b", events.TaskScheduled{Spec: kind(spec("t4", "repo", "x", "team", "red"), "resize")}) // at+4s
	add("t5", "a", events.TaskScheduled{Spec: kind(spec("t5", "repo", "y"), "resize")})                // at+5s

	ids := func(f Filter, after string, limit int) []string {
		var out []string
		for _, s := range e.List(f, after, limit) {
			out = append(out, s.TaskID)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		f    Filter
		want []string
	}{
		{"OneLabel", Filter{Labels: map[string]string{"repo": "x"}}, []string{"t1", "t2", "t4"}},
		{"TwoLabels", Filter{Labels: map[string]string{"repo": "x", "team": "red"}}, []string{"t1", "t4"}},
		{"LabelAndCustomer", Filter{Labels: map[string]string{"repo": "x"}, CustomerID: "a"}, []string{"t1", "t2"}},
		{"LabelAndStatus", Filter{Labels: map[string]string{"repo": "x"}, Status: aggregate.StatusRunning}, nil},
		{"UnknownPair", Filter{Labels: map[string]string{"repo": "z"}}, nil},
		{"KnownAndUnknownPair", Filter{Labels: map[string]string{"repo": "x", "team": "blue"}}, nil},
		{"EmptyValueIsAValue", Filter{Labels: map[string]string{"repo": ""}}, nil},
		{"TaskID", Filter{TaskID: "t3"}, []string{"t3"}},
		{"TaskIDOfAnotherCustomer", Filter{TaskID: "t4", CustomerID: "a"}, nil},
		{"MissingTaskID", Filter{TaskID: "nope"}, nil},
		{"CreatedAfter", Filter{CreatedAfter: at.Add(3 * time.Second)}, []string{"t4", "t5"}},
		{"CreatedBefore", Filter{CreatedBefore: at.Add(3 * time.Second)}, []string{"t1", "t2"}},
		{"CreatedBetween", Filter{CreatedAfter: at.Add(time.Second), CreatedBefore: at.Add(5 * time.Second)}, []string{"t2", "t3", "t4"}},
		{"CreatedAndLabel", Filter{CreatedAfter: at.Add(time.Second), Labels: map[string]string{"team": "red"}}, []string{"t4"}},
		{"LabelAndIDPrefix", Filter{Labels: map[string]string{"repo": "x"}, IDPrefix: "t4"}, []string{"t4"}},
		{"TaskIDAndOtherIDPrefix", Filter{TaskID: "t3", IDPrefix: "t1"}, nil},
		{"CreatedAndIDPrefixOfACustomer", Filter{CreatedAfter: at.Add(time.Second), IDPrefix: "t", CustomerID: "a"}, []string{"t2", "t3", "t5"}},
		{"StatusAndIDPrefix", Filter{Status: aggregate.StatusScheduled, IDPrefix: "t5"}, []string{"t5"}},
		{"Kind", Filter{Kind: "resize"}, []string{"t1", "t4", "t5"}},
		{"KindAndCustomer", Filter{Kind: "resize", CustomerID: "a"}, []string{"t1", "t5"}},
		{"KindAndLabel", Filter{Kind: "resize", Labels: map[string]string{"repo": "x"}}, []string{"t1", "t4"}},
		{"KindAndStatus", Filter{Kind: "thumb", Status: aggregate.StatusScheduled}, []string{"t3"}},
		{"UnknownKind", Filter{Kind: "nope"}, nil},
	} {
		if got := ids(tc.f, "", 100); !slices.Equal(got, tc.want) {
			t.Errorf("%s: List = %v, want %v", tc.name, got, tc.want)
		}
	}
	repoX := Filter{Labels: map[string]string{"repo": "x"}}
	if p1, p2 := ids(repoX, "", 2), ids(repoX, "t2", 2); !slices.Equal(p1, []string{"t1", "t2"}) || !slices.Equal(p2, []string{"t4"}) {
		t.Errorf("pages by label: %v then %v", p1, p2)
	}
	if st, _ := e.Task("t1"); st.Spec.Labels["team"] != "red" {
		t.Errorf("Task t1 labels = %v", st.Spec.Labels)
	}
	if st, _ := e.Task("t3"); st.Spec.Labels != nil {
		t.Errorf("Task t3 labels = %v, want none", st.Spec.Labels)
	}
	if _, ok := e.v.labels.of["t3"]; ok {
		t.Error("an unlabeled task is in the label index")
	}
	if st, _ := e.Task("t1"); st.Spec.Kind != "resize" || st.Spec.Payload != nil {
		t.Errorf("Task t1 kind %q payload %q, want resize and no payload (not in the views)", st.Spec.Kind, st.Spec.Payload)
	}
	if _, ok := e.v.kinds.of["t2"]; ok {
		t.Error("a task without a kind is in the kind index")
	}
	data, err := encodeSnapshot(e.Positions(), e.v.body())
	if err != nil {
		t.Fatal(err)
	}
	_, b, err := decodeSnapshot(data, e.Positions())
	if err != nil {
		t.Fatal(err)
	}
	restored, _ := New(Config{Retain: -1})
	restored.v = restore(b, -1, events.Shards{})
	if !reflect.DeepEqual(restored.v.kinds, e.v.kinds) {
		t.Errorf("kind index restored from a snapshot %v, live %v", restored.v.kinds, e.v.kinds)
	}
}
