package events

import (
	"time"
	"unicode/utf8"
)

// Limits on every field a client controls. The aggregate enforces them on
// every command, before anything is written, so the verifier sees the
// same rules; clients read them to stay within bounds. docs/operations.md
// lists them in its "Limits and defaults" table, docs/openapi.yaml field by
// field.
const (
	MinTimeoutSeconds     = 1
	MaxTimeoutSeconds     = 604800 // a week
	DefaultTimeoutSeconds = 3600
	MaxEffects            = 32       // effects in one result or one report
	MaxTaskEffects        = 256      // distinct effects (by kind and ref) of one task
	MaxSummaryBytes       = 16 << 10 // a result's summary
	MaxErrorBytes         = 16 << 10 // a result's error
	MaxMessageBytes       = 64 << 10 // one message: its parts' types and texts
	MaxContentParts       = 64       // parts of one message
	MaxReasonBytes        = 1 << 10  // a cancel's or an admission rejection's reason
	MaxRunRevisions       = 100000   // saved revisions (RunSaved) of one task's Run
	// A retry policy's bounds and defaults (TaskSpec.Retry).
	MaxAttempts              = 100
	DefaultBackoffSeconds    = 10
	MaxBackoffSeconds        = 86400 // a policy's backoffSeconds
	DefaultMaxBackoffSeconds = 3600
	MaxMaxBackoffSeconds     = MaxTimeoutSeconds // a policy's maxBackoffSeconds
	// MaxNameBytes bounds the short free-text fields: an effect's kind
	// and ref, a content part's type, and the signal's id, requestId,
	// eventType and eventAction.
	MaxNameBytes = 256
	// MaxURLBytes bounds an effect's url, the signal's uri and a task's
	// repo.
	MaxURLBytes = 4 << 10
	// MinConcurrencyLimit and MaxConcurrencyLimit bound a task's
	// concurrency limit; its key has 1 to MaxNameBytes bytes.
	MinConcurrencyLimit = 1
	MaxConcurrencyLimit = 1000

	// A claim's heartbeat interval (heartbeatSeconds; 0 is none) and the
	// releases of one task that do not count against its retry policy.
	MinHeartbeatSeconds = 1
	MaxHeartbeatSeconds = 3600
	MaxFreeReleases     = 100

	MaxLabels          = 16  // label pairs of one task
	MaxLabelKeyBytes   = 63  // a label key: [a-z0-9][a-z0-9_./-]{0,62}
	MaxLabelValueBytes = 256 // a label value: valid UTF-8, may be empty

	// MaxKindBytes bounds a task's kind: [a-z0-9][a-z0-9._-]{0,63}.
	MaxKindBytes = 64
	// MaxPayloadBytes and MaxOutputBytes bound a task's payload and a
	// result's output, counted as compact JSON.
	MaxPayloadBytes = 256 << 10
	MaxOutputBytes  = 256 << 10
)

// ValidKind reports whether k is a task kind: 1 to MaxKindBytes of
// lower-case letters, digits and . _ -, starting with a letter or digit.
func ValidKind(k string) bool {
	if k == "" || len(k) > MaxKindBytes {
		return false
	}
	for i := range len(k) {
		c := k[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// ValidLabelKey reports whether k is a label key: 1 to MaxLabelKeyBytes
// of lower-case letters, digits and _ . / -, starting with a letter or
// digit.
func ValidLabelKey(k string) bool {
	if k == "" || len(k) > MaxLabelKeyBytes {
		return false
	}
	for i := range len(k) {
		c := k[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '/' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// Truncate returns the longest prefix of s of at most n bytes that does
// not split a UTF-8 sequence.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Defaults shared by the server, the tools and the SDKs.
const (
	DefaultStream = "TASKLEDGER" // the event stream; the ready stream is DefaultStream + "_READY"
	DefaultQueue  = "default"
	// DefaultCustomer owns the tasks an operator schedules without
	// naming a customer (every task, on a server without an auth file).
	DefaultCustomer = "default"
)

// DefaultReadyGrace is how long after a release the Deliver timer queue
// leaves a ready notification to the releaser's own publish before the
// alarm publishes it itself, the path after a crash: longer than a publish
// and the append after it normally take. A shorter one costs only work:
// the second copy of the notification is dropped by the ready stream as a
// duplicate, and one of the two ReadyPublished is stale. The alarm, the
// scheduler and the ready queue's dispatcher default to it.
const DefaultReadyGrace = time.Second

// ReadyStreamName is the ready notification stream that goes with the
// event stream.
func ReadyStreamName(stream string) string { return stream + "_READY" }

// ChildResultID is the mailbox message id under which a child's terminal
// result is reported to its parent, so the report is appended at most once.
func ChildResultID(childID string) string { return "child-" + childID }

// ChildResultType is the content part type of a child's report.
const ChildResultType = "child_result"

// ChildResult is the JSON text of the content part that reports a child's
// outcome to its parent.
// When the whole report would not fit in one message (MaxMessageBytes),
// its result's summary, error and effects are cut and Truncated is set:
// the child's full result is read from the child task itself (TaskID).
type ChildResult struct {
	TaskID    string  `json:"taskId"`
	Status    string  `json:"status"`
	Reason    string  `json:"reason,omitempty"`
	Result    *Result `json:"result,omitempty"`
	Truncated bool    `json:"truncated,omitempty"`
}
