package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
	"github.com/taskledger/taskledger/projections"
)

// ErrAdmissionRejected is returned when admission refused a new root
// task (service.ErrAdmissionRejected).
var ErrAdmissionRejected = service.ErrAdmissionRejected

// AdmissionError holds the task admission refused
// (service.AdmissionError).
type AdmissionError = service.AdmissionError

// Quota limits a customer's new root tasks. Zero means unlimited.
type Quota struct {
	MaxActiveRoots    int `json:"maxActiveRoots"`
	MaxRootsPerMinute int `json:"maxRootsPerMinute"`
}

// Admission configures admission control of new root tasks. Children and
// idempotent replays are never charged.
type Admission struct {
	Default     Quota            `json:"default"`
	PerCustomer map[string]Quota `json:"customers"`
	// CheckerURL, if set, is asked about every new root task with a POST
	// of UsageQuery; it answers UsageVerdict. An error, a timeout or a
	// non-200 answer admits the task (fail-open), logged and counted.
	CheckerURL     string        `json:"checkerUrl"`
	CheckerTimeout time.Duration `json:"-"` // default 500ms
}

// UsageQuery is the body sent to the external usage checker.
type UsageQuery struct {
	CustomerID  string `json:"customerId"`
	Queue       string `json:"queue"`
	RequestID   string `json:"requestId,omitempty"`
	ActiveRoots int    `json:"activeRoots"`
	RecentRoots int    `json:"recentRoots"`
}

// UsageVerdict is the external usage checker's answer.
type UsageVerdict struct {
	Allow  bool   `json:"allow"`
	Reason string `json:"reason"`
}

func (a Admission) quota(customerID string) Quota {
	if q, ok := a.PerCustomer[customerID]; ok {
		return q
	}
	return a.Default
}

// Usage is what admission reads from the projections.
type Usage interface {
	// Admissions returns how many root tasks of customerID are live and
	// how many it was admitted since since.
	Admissions(customerID string, since time.Time) (active, recent int)
}

// admit decides whether a new root task may be scheduled and returns the
// reason when it may not. The counts come from the usage projection, so
// racing requests of one customer may overshoot a quota by the number in
// flight at once. now is the request's time.
func (s *tasks) admit(ctx context.Context, customerID string, spec events.TaskSpec, now time.Time) string {
	a := s.admission
	active, recent := s.usage.Admissions(customerID, now.Add(-projections.AdmissionWindow))
	q := a.quota(customerID)
	if q.MaxActiveRoots > 0 && active >= q.MaxActiveRoots {
		return fmt.Sprintf("quota: %d active root tasks, at most %d", active, q.MaxActiveRoots)
	}
	if q.MaxRootsPerMinute > 0 && recent >= q.MaxRootsPerMinute {
		return fmt.Sprintf("quota: %d root tasks in the last minute, at most %d", recent, q.MaxRootsPerMinute)
	}
	if a.CheckerURL == "" {
		return ""
	}
	v, err := s.askChecker(ctx, UsageQuery{CustomerID: customerID, Queue: spec.Queue, RequestID: spec.RequestID, ActiveRoots: active, RecentRoots: recent})
	if err != nil {
		s.metrics.CheckerFailures.Inc()
		s.logger.Warn().Err(err).Str("customer", customerID).Msg("usage checker unavailable; admitting (fail-open)")
		return ""
	}
	if !v.Allow {
		if v.Reason == "" {
			v.Reason = "refused by the usage checker"
		}
		return events.Truncate("usage: "+v.Reason, events.MaxReasonBytes) // the checker's text, bounded as every reason is
	}
	return ""
}

func (s *tasks) askChecker(ctx context.Context, q UsageQuery) (UsageVerdict, error) {
	timeout := s.admission.CheckerTimeout
	if timeout <= 0 {
		timeout = 500 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, _ := json.Marshal(q)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.admission.CheckerURL, bytes.NewReader(body))
	if err != nil {
		return UsageVerdict{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return UsageVerdict{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return UsageVerdict{}, fmt.Errorf("usage checker answered %s", resp.Status)
	}
	var v UsageVerdict
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<16)).Decode(&v); err != nil {
		return UsageVerdict{}, fmt.Errorf("usage checker answer: %w", err)
	}
	return v, nil
}
