package events

import (
	"errors"
	"fmt"
)

// ErrInvalidID is returned by ValidID for an id outside [A-Za-z0-9_-]{1,64}.
var ErrInvalidID = errors.New("events: invalid id")

// MaxIDLen is the longest id ValidID accepts.
const MaxIDLen = 64

// ValidID reports whether id may be used as a task, customer, request,
// queue, executor or message id: 1 to 64 characters of [A-Za-z0-9_-]. Such
// an id can never inject '.', '*' or '>' into a NATS subject.
func ValidID(id string) error {
	if len(id) == 0 {
		return fmt.Errorf("%w: empty", ErrInvalidID)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: longer than %d characters", ErrInvalidID, MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q has a character outside [A-Za-z0-9_-]", ErrInvalidID, id)
		}
	}
	return nil
}

// Subjects names the NATS subjects of one taskledger installation. Root
// is the first subject token, "tl" by default; tests and side by
// side installations on one NATS use their own.
type Subjects struct{ Root string }

// DefaultSubjects are the documented subjects: tl.evt.>, tl.ready.>.
var DefaultSubjects = Subjects{Root: "tl"}

// Event is the log subject that holds every event of one task:
// <root>.evt.<customerId>.<taskId>. Both ids must be valid.
func (s Subjects) Event(customerID, taskID string) string {
	return s.Root + ".evt." + customerID + "." + taskID
}

// Task matches the events of taskID whatever its customer, for reads that
// know only the task id.
func (s Subjects) Task(taskID string) string { return s.Root + ".evt.*." + taskID }

// Customer matches the events of every task of customerID.
func (s Subjects) Customer(customerID string) string { return s.Root + ".evt." + customerID + ".>" }

// Events matches the whole log.
func (s Subjects) Events() string { return s.Root + ".evt.>" }

// Key is the log subject that holds every event of one concurrency key:
// <root>.conc.<customerId>.<keyId>, keyId being KeyID(customerId, key).
func (s Subjects) Key(customerID, keyID string) string {
	return s.Root + ".conc." + customerID + "." + keyID
}

// Keys matches the events of every concurrency key.
func (s Subjects) Keys() string { return s.Root + ".conc.>" }

// Heartbeats is where a scheduler process announces each claim heartbeat
// it renewed (core NATS, stored by no stream), so that every process's
// projections renew it too: the body is "<taskId> <deliveryId>".
func (s Subjects) Heartbeats() string { return s.Root + ".hb" }

// Ready is where ready notifications for queue are published.
func (s Subjects) Ready(queue string) string { return s.Root + ".ready." + queue }

// AllReady matches the ready notifications of every queue.
func (s Subjects) AllReady() string { return s.Root + ".ready.>" }

// ReadyNotification is the body of a ready notification on
// <root>.ready.<queue>, msgpack or JSON with the same field names
// (MarshalReady, UnmarshalReady). It is permission to try a claim with
// DeliveryID, not ownership: notifications are at-least-once.
type ReadyNotification struct {
	TaskID     string `json:"taskId"`
	CustomerID string `json:"customerId"`
	RootID     string `json:"rootId"`
	ParentID   string `json:"parentId"`
	Queue      string `json:"queue"`
	DeliveryID string `json:"deliveryId"`
	Signal     Signal `json:"signal"`
	// Attempt is the task's attempt this delivery is for, from 1 (see
	// TaskSpec.Retry); left out by servers before retries.
	Attempt int `json:"attempt,omitempty"`
	// Labels are the task's labels; left out when it has none.
	Labels map[string]string `json:"labels,omitempty"`
	// Kind is the task's kind (TaskSpec.Kind); left out when it has none.
	// The payload is not carried: the claim answers it.
	Kind string `json:"kind,omitempty"`
}
