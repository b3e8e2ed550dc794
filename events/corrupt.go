package events

import (
	"fmt"
	"strings"
	"time"
)

// CorruptError is a message stored on the log that cannot be read as an
// event: it does not decode (Err wraps ErrMalformed, ErrUnknownType or
// ErrUnknownVersion). A message that decodes but fails the chain's check
// is no CorruptError: replay verify and the chain key's checks report
// it (taskledger_chain_unverified_events). Readers of the
// log quarantine such a message instead of stopping at it: a task whose
// subject holds one answers with this error (corrupt_event), a read over
// many tasks skips it with a marker and goes on. Test for it with
// errors.As.
type CorruptError struct {
	Pos     Position  // where the log holds the message
	Subject string    // its subject; "" where the reader does not know it
	At      time.Time // when the log stored it; zero where unknown
	Err     error     // why it cannot be read
}

func (e *CorruptError) Error() string {
	on := ""
	if e.Subject != "" {
		on = " on " + e.Subject
	}
	return fmt.Sprintf("the log's message at seq %d%s is corrupt (quarantined): %v", e.Pos, on, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// TaskID returns the id of the task whose subject holds the message, or
// "" when its subject is unknown or not a task's.
func (e *CorruptError) TaskID() string {
	_, task, _ := TaskSubject(e.Subject)
	return task
}

// TaskSubject returns the customer and task ids a task subject
// (<root>.evt.<customerId>.<taskId>, whatever the root and its shard)
// names; ok is false for any other subject. Of a task's filter that
// matches any customer (Subjects.Task: <root>.evt.*.<taskId>) the
// customer id is "".
func TaskSubject(subject string) (customerID, taskID string, ok bool) {
	tokens := strings.Split(subject, ".")
	n := len(tokens)
	if n < 4 || tokens[n-3] != "evt" || ValidID(tokens[n-1]) != nil {
		return "", "", false
	}
	if customerID = tokens[n-2]; customerID == "*" {
		return "", tokens[n-1], true
	}
	if ValidID(customerID) != nil {
		return "", "", false
	}
	return customerID, tokens[n-1], true
}
