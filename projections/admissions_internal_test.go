package projections

import (
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// TestAdmissionsRecent: recent counts the root tasks admitted strictly
// after since, whatever the order they were admitted in and with ties
// on since itself; children and other customers do not count.
func TestAdmissionsRecent(t *testing.T) {
	t.Parallel()
	v := newViews(DefaultRetain, events.Shards{})
	vw := &Views{v: v}
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	root := &aggregate.State{CustomerID: "a"}
	for _, s := range []int{3, 1, 2, 2, 5, 4} {
		v.admit(root, t0.Add(time.Duration(s)*time.Second))
	}
	v.admit(&aggregate.State{CustomerID: "a", Spec: events.TaskSpec{ParentID: "p"}}, t0.Add(6*time.Second))
	v.admit(&aggregate.State{CustomerID: "b"}, t0.Add(6*time.Second))
	for _, c := range []struct {
		since time.Time
		want  int
	}{
		{time.Time{}, 6},
		{t0.Add(time.Second), 5},
		{t0.Add(2 * time.Second), 3},
		{t0.Add(2500 * time.Millisecond), 3},
		{t0.Add(5 * time.Second), 0},
		{t0.Add(time.Hour), 0},
	} {
		if _, got := vw.Admissions("a", c.since); got != c.want {
			t.Errorf("Admissions(a, t0+%v) recent = %d, want %d", c.since.Sub(t0), got, c.want)
		}
	}
}
