package events

// Limits on what a task carries. The aggregate enforces them on every
// command; clients read them to stay within bounds.
const (
	MinTimeoutSeconds     = 1
	MaxTimeoutSeconds     = 604800 // a week
	DefaultTimeoutSeconds = 3600
	MaxEffects            = 32       // effects in one result
	MaxSummaryBytes       = 16 << 10 // a result's summary
	MaxMessageBytes       = 64 << 10 // one message: its parts' types and texts
)

// Defaults shared by the server, the tools and the SDKs.
const (
	DefaultStream = "TASKLEDGER" // the event stream; the ready stream is DefaultStream + "_READY"
	DefaultQueue  = "default"
	// DefaultCustomer owns the tasks an operator schedules without
	// naming a customer (every task, on a server without an auth file).
	DefaultCustomer = "default"
)

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
type ChildResult struct {
	TaskID string  `json:"taskId"`
	Status string  `json:"status"`
	Reason string  `json:"reason,omitempty"`
	Result *Result `json:"result,omitempty"`
}
