package projections

import (
	"cmp"
	"slices"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// QueueStats are the statistics of one customer's tasks on one queue
// (GET /v1/stats), from counters the views keep as events apply.
type QueueStats struct {
	CustomerID, Queue string
	Counts            map[aggregate.Status]int // tasks per status, none left out as 0
	// OldestQueued is how long ago the delivery of the queued task
	// published longest ago was due; 0 with none queued.
	OldestQueued time.Duration
	// Claims and Results are Claimed and ResultRecorded events per second
	// over the last minute and five minutes of event time.
	Claims1m, Claims5m, Results1m, Results5m float64
	NearTimeout                              int // running tasks past 80 % of their timeout
	Retries                                  int // delivery attempts past the first of the live tasks' current deliveries
	Rejections                               int // tasks admission refused
}

// rateBucket is the width of one bucket of a rate ring; rateBuckets of
// them cover the longest window, five minutes.
const (
	rateBucket  = 10 * time.Second
	rateBuckets = 30
)

// rateRing counts events per rateBucket of event time, for the last
// rateBuckets buckets: constant memory per queue.
type rateRing struct {
	bucket [rateBuckets]int64 // the bucket number each slot counts
	n      [rateBuckets]int32
}

func (r *rateRing) add(at time.Time) {
	b := at.UnixNano() / int64(rateBucket)
	i := b % rateBuckets
	if r.bucket[i] != b {
		r.bucket[i], r.n[i] = b, 0
	}
	r.n[i]++
}

// rate is the events per second in the window (a whole number of
// buckets) ending with now's bucket.
func (r *rateRing) rate(now time.Time, window time.Duration) float64 {
	last := now.UnixNano() / int64(rateBucket)
	first := last - int64(window/rateBucket) + 1
	sum := 0
	for i, b := range r.bucket {
		if b >= first && b <= last {
			sum += int(r.n[i])
		}
	}
	return float64(sum) / window.Seconds()
}

// queueCounters are the counters of one customer's tasks on one queue.
// Those the task states give (counts, retries, rejections, the running
// tasks' 80 % marks) move with reindex and drop, so a snapshot restores
// them; the rates count events as they apply, since the views were made.
type queueCounters struct {
	counts          map[aggregate.Status]int
	retries         int
	rejections      int
	nearAt          map[string]int64 // running task → Unix ns at 80 % of its timeout
	claims, results rateRing
}

// counters returns the counters of customer's tasks on queue, making
// them when make is set (else nil when there are none).
func (v *views) counters(customer, queue string, create bool) *queueCounters {
	qs := v.stats[customer]
	if qs == nil {
		if !create {
			return nil
		}
		qs = map[string]*queueCounters{}
		v.stats[customer] = qs
	}
	c := qs[queue]
	if c == nil && create {
		c = &queueCounters{counts: map[aggregate.Status]int{}, nearAt: map[string]int64{}}
		qs[queue] = c
	}
	return c
}

// count moves a task from its state before to after in the counters
// (a zero state: not counted).
func (v *views) count(before, after *aggregate.State) {
	if before.Exists() {
		v.counters(before.CustomerID, before.Spec.Queue, true).add(before, -1)
	}
	if after.Exists() {
		v.counters(after.CustomerID, after.Spec.Queue, true).add(after, 1)
	}
}

func (c *queueCounters) add(s *aggregate.State, n int) {
	if c.counts[s.Status] += n; c.counts[s.Status] <= 0 {
		delete(c.counts, s.Status)
	}
	if s.Rejected {
		c.rejections += n
	}
	if !s.Status.Terminal() && s.Delivery.Attempt > 1 {
		c.retries += n * (s.Delivery.Attempt - 1)
	}
	if s.Status == aggregate.StatusRunning {
		if n > 0 {
			c.nearAt[s.TaskID] = s.StartedAt.UnixNano() + s.Deadline.Sub(s.StartedAt).Nanoseconds()*4/5
		} else {
			delete(c.nearAt, s.TaskID)
		}
	}
}

// rate counts a claim or a result of the task at s.
func (v *views) rate(ev events.Event, s *aggregate.State) {
	switch ev.Data.(type) {
	case events.Claimed:
		v.counters(s.CustomerID, s.Spec.Queue, true).claims.add(ev.At)
	case events.ResultRecorded:
		v.counters(s.CustomerID, s.Spec.Queue, true).results.add(ev.At)
	}
}

// Stats returns the statistics of customerID's queues ("": every
// customer's) at now, ordered by customer then queue. It costs the
// queues and their running tasks, not every task. Safe for concurrent
// use.
func (vw *Views) Stats(customerID string, now time.Time) []QueueStats {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	var out []QueueStats
	for customer, qs := range vw.v.stats {
		if customerID != "" && customer != customerID {
			continue
		}
		for queue, c := range qs {
			out = append(out, vw.v.queueStats(customer, queue, c, now))
		}
	}
	slices.SortFunc(out, func(a, b QueueStats) int {
		return cmp.Or(cmp.Compare(a.CustomerID, b.CustomerID), cmp.Compare(a.Queue, b.Queue))
	})
	return out
}

func (v *views) queueStats(customer, queue string, c *queueCounters, now time.Time) QueueStats {
	s := QueueStats{
		CustomerID: customer, Queue: queue, Counts: make(map[aggregate.Status]int, len(c.counts)),
		Claims1m: c.claims.rate(now, time.Minute), Claims5m: c.claims.rate(now, 5*time.Minute),
		Results1m: c.results.rate(now, time.Minute), Results5m: c.results.rate(now, 5*time.Minute),
		Retries: c.retries, Rejections: c.rejections,
	}
	for st, n := range c.counts {
		s.Counts[st] = n
	}
	for _, at := range c.nearAt {
		if at <= now.UnixNano() {
			s.NearTimeout++
		}
	}
	if h := v.timers[Republish].byCustomer[queueBucket(customer, queue)]; h != nil {
		if item, ok := h.min(); ok {
			if t := v.tasks[item.key]; t != nil && t.firstAt != 0 {
				s.OldestQueued = max(0, now.Sub(time.Unix(0, t.firstAt)))
			}
		}
	}
	return s
}
