package service

import (
	"time"

	"github.com/taskledger/taskledger/api"
)

// ClaimOption is a per-call choice of a claim (Claim, ClaimNext,
// ClaimBatch) besides its executor: api.WithHeartbeat.
type ClaimOption = api.ClaimOption

// Renewal is the answer to a heartbeat: the claim is held until
// ExpiresAt unless renewed again (never after Deadline, the task's
// running deadline).
type Renewal struct {
	ExpiresAt time.Time
	Deadline  time.Time
}
