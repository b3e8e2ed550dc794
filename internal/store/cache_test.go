package store

import (
	"fmt"
	"testing"

	"github.com/taskledger/taskledger/aggregate"
)

func cacheState(id string, status aggregate.Status) aggregate.State {
	return aggregate.State{TaskID: id, Status: status, Version: 1}
}

// TestTaskCacheFinishedDoNotEvictLive fills the cache with many more
// finished tasks than it holds: every live task stays, and only the
// most recent size/8 finished ones are kept, oldest out first.
func TestTaskCacheFinishedDoNotEvictLive(t *testing.T) {
	c := newTaskCache(64) // 8 finished
	for i := range 64 {
		c.put(cacheState(fmt.Sprintf("live-%d", i), aggregate.StatusRunning))
	}
	for i := range 1000 {
		c.put(cacheState(fmt.Sprintf("done-%d", i), aggregate.StatusSucceeded))
	}
	for i := range 64 {
		if _, ok := c.get(fmt.Sprintf("live-%d", i)); !ok {
			t.Fatalf("live-%d was evicted by finished tasks", i)
		}
	}
	if len(c.finished) != 8 {
		t.Fatalf("%d finished tasks cached, want 8", len(c.finished))
	}
	for i := range 1000 {
		_, ok := c.get(fmt.Sprintf("done-%d", i))
		if want := i >= 992; ok != want {
			t.Fatalf("done-%d cached = %v, want %v", i, ok, want)
		}
	}
}

// TestTaskCacheFinishing moves a task from the live part to the finished
// one when it ends, and a dropped task's ring slot, reused, does not
// evict the task when it comes back.
func TestTaskCacheFinishing(t *testing.T) {
	c := newTaskCache(16) // 2 finished
	c.put(cacheState("a", aggregate.StatusQueued))
	c.put(cacheState("a", aggregate.StatusCanceled))
	if _, ok := c.live["a"]; ok {
		t.Fatal("a finished task stayed among the live ones")
	}
	if st, ok := c.get("a"); !ok || st.Status != aggregate.StatusCanceled {
		t.Fatalf("get(a) = %v, %v; want the canceled state", st.Status, ok)
	}
	c.drop("a")
	if _, ok := c.get("a"); ok {
		t.Fatal("a dropped task is still cached")
	}
	c.put(cacheState("a", aggregate.StatusCanceled)) // slot 1; slot 0 is free
	c.put(cacheState("b", aggregate.StatusCanceled)) // slot 0
	if _, ok := c.get("a"); !ok {
		t.Fatal("reusing a's old slot evicted a")
	}
	c.put(cacheState("c", aggregate.StatusCanceled)) // slot 1: a, the oldest, goes
	if _, ok := c.get("a"); ok {
		t.Fatal("the oldest finished task was kept past the ring")
	}
	for _, id := range []string{"b", "c"} {
		if _, ok := c.get(id); !ok {
			t.Fatalf("%s was evicted", id)
		}
	}
	off := newTaskCache(-1)
	off.put(cacheState("x", aggregate.StatusQueued))
	if _, ok := off.get("x"); ok {
		t.Fatal("a disabled cache cached")
	}
}
