// Package crashpoint marks the interruption points of the delivery
// pipeline; see Hit.
package crashpoint

// The interruption points of the delivery pipeline (issue: crash at each).
const (
	Scheduled     = "scheduled"      // TaskScheduled appended, release not yet armed
	Released      = "released"       // DeliveryPending appended, ready not yet published
	Published     = "published"      // ready published, ReadyPublished not yet appended
	ClaimReceived = "claim-received" // a claim request arrived, Claimed not yet appended
	Claimed       = "claimed"        // Claimed appended, the executor not yet answered
	ResultPending = "result-pending" // a result is being reported, not yet appended
	ResultStored  = "result-stored"  // ResultRecorded appended, the executor not yet answered
	// SlotAcquired: a concurrency key's SlotAcquired appended, the task
	// not yet released. Only traffic with concurrency keys reaches it, so
	// it is not in All; TestCrashAtSlotAcquired crashes there.
	SlotAcquired = "slot-acquired"
	// RetryScheduled: the alarm appended a RetryScheduled for a timed-out
	// attempt, the next attempt not yet released.
	RetryScheduled = "retry-scheduled"
	// Fired is a schedule's: ScheduleFired appended, the run's task not
	// yet scheduled. It is not in All (its traffic is a schedule's).
	Fired = "fired"
)

// All lists every point the crash traffic (cmd/taskledger TestCrashPoints)
// passes; RetryScheduled, which needs tasks with a retry policy, has its
// own test.
var All = []string{Scheduled, Released, Published, ClaimReceived, Claimed, ResultPending, ResultStored}
