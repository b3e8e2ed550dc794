package api

import "net/http"

// Error is the body of every non-2xx answer, and the error every Client
// method returns for one. Test it against the sentinels below with
// errors.Is, which compares the code and the reason, never the status
// number or the message.
type Error struct {
	Code    string `json:"error"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"` // with Code "conflict", "too_many_requests" or "forbidden" (operator_only)
	Task    *Task  `json:"task,omitempty"`   // with Code "admission_rejected": the task as recorded
	Seq     uint64 `json:"seq,omitempty"`    // with Code "corrupt_event": the log position of the message that does not decode
	Status  int    `json:"-"`                // the HTTP status it came with
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return e.Code + " (" + e.Reason + "): " + e.Message
	}
	return e.Code + ": " + e.Message
}

// Is reports whether target is an *Error with the same code and reason,
// so errors.Is(err, api.ErrTerminal) holds for any 409 whose reason is
// "terminal".
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Reason == e.Reason
}

// The errors a server answers with. Each is matched by errors.Is on an
// *Error with its code and reason, whatever the message.
var (
	// ErrInvalid (400): the request is malformed or breaks a limit.
	ErrInvalid = &Error{Status: http.StatusBadRequest, Code: "invalid_argument", Message: "invalid argument"}
	// ErrUnauthenticated (401): the server needs a known bearer token.
	ErrUnauthenticated = &Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "a valid bearer token is required"}
	// ErrForbidden (403): a cross-origin browser request, or (without an
	// auth file) a Host that is not a loopback name or address.
	ErrForbidden = &Error{Status: http.StatusForbidden, Code: "forbidden", Message: "cross-origin browser requests are refused"}
	// ErrOperatorOnly (403, reason operator_only): a customer's token
	// asked for an operator's action: a result without the claim's
	// deliveryId.
	ErrOperatorOnly = &Error{Status: http.StatusForbidden, Code: "forbidden", Reason: "operator_only", Message: "only an operator may do this"}
	// ErrNotFound (404): no such task for this caller (another customer's
	// task is not found either), or no such route.
	ErrNotFound = &Error{Status: http.StatusNotFound, Code: "not_found", Message: "not found"}
	// ErrTerminal (409): the task has ended; nothing may change it.
	ErrTerminal = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "terminal", Message: "task is terminal"}
	// ErrTokenMismatch (409): the delivery token is not the current one;
	// another executor holds the task, or the notification was stale.
	ErrTokenMismatch = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "token_mismatch", Message: "delivery token mismatch"}
	// ErrClaimLost (409): the claim under this delivery token ended
	// without a result, its heartbeat missed or released (ClaimLost);
	// the task may be held by another executor now. Stop working on it.
	ErrClaimLost = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "claim_lost", Message: "claim lost"}
	// ErrNotTerminal (409): a retry of a task that has not finished.
	ErrNotTerminal = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "not_terminal", Message: "task is not terminal"}
	// ErrNotClaimable (409): the task is not queued for a claim.
	ErrNotClaimable = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "not_claimable", Message: "task is not claimable"}
	// ErrParentTerminal (409): a child was scheduled under an ended parent.
	ErrParentTerminal = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "parent_terminal", Message: "parent task is terminal"}
	// ErrAncestorTerminal (409): a child was scheduled under a parent one
	// of whose ancestors has ended, or a claim found an ancestor of its
	// task ended and recorded the task canceled (reason
	// ancestor_terminal) instead of starting it.
	ErrAncestorTerminal = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "ancestor_terminal", Message: "ancestor task is terminal"}
	// ErrRequestIDConflict (409): the requestId was used before for a
	// task under another parent (or for a root task, or a child): it
	// names that task, not this request's.
	ErrRequestIDConflict = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "request_id_conflict", Message: "requestId used under another parent"}
	// ErrLineageLimit (409): a child would make its lineage deeper or
	// larger than the server allows (--max-lineage-depth,
	// --max-lineage-tasks).
	ErrLineageLimit = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "lineage_limit", Message: "lineage limit reached"}
	// ErrRequestTimeout (408): the body did not arrive within the
	// server's body timeout.
	ErrRequestTimeout = &Error{Status: http.StatusRequestTimeout, Code: "request_timeout", Message: "request body timed out"}
	// ErrPayloadTooLarge (413): the body is over MaxBodyBytes, or the
	// event it makes is larger than the log takes (the message names the
	// limit). Retrying the same request cannot succeed.
	ErrPayloadTooLarge = &Error{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large", Message: "body too large"}
	// ErrUnsupportedMediaType (415): a request with a body (or any
	// Content-Type) whose Content-Type is not application/json; the
	// message says what was sent.
	ErrUnsupportedMediaType = &Error{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type", Message: "Content-Type must be application/json"}
	// ErrAdmissionRejected (429): a quota refused a new root task; the
	// Error's Task is the task as recorded (canceled).
	ErrAdmissionRejected = &Error{Status: http.StatusTooManyRequests, Code: "admission_rejected", Message: "admission rejected"}
	// ErrTooManyPolls (429): the customer already holds as many long polls
	// (claims/next, batch claims) as the server allows at once.
	ErrTooManyPolls = &Error{Status: http.StatusTooManyRequests, Code: "too_many_requests", Reason: "too_many_polls", Message: "too many long polls"}
	// ErrHeaderTooLarge (431): the request's header block is over the
	// server's limit.
	ErrHeaderTooLarge = &Error{Status: http.StatusRequestHeaderFieldsTooLarge, Code: "header_too_large", Message: "request header too large"}
	// ErrUnavailable (503): the server could not answer in time; retry
	// after a moment.
	ErrUnavailable = &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "unavailable"}
	// ErrCorruptEvent (500): the task (or concurrency key, or schedule)
	// has a message on the log that does not decode; Seq names its
	// position. The message is quarantined and there is no repair: it
	// stays on the log, retrying never helps (it is not ErrUnavailable);
	// schedule the task's work again as a new task.
	ErrCorruptEvent = &Error{Status: http.StatusInternalServerError, Code: "corrupt_event", Message: "the log holds a message of this task that does not decode"}
	// ErrInternal (500): a bug on the server's side.
	ErrInternal = &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error"}
)

// WithMessage returns a copy of e carrying msg: how a server makes the
// error it answers with from a sentinel.
func (e *Error) WithMessage(msg string) *Error {
	c := *e
	c.Message = msg
	return &c
}
