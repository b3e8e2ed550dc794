package crashpoint_test

import (
	"testing"

	"github.com/taskledger/taskledger/internal/crashpoint"
	"github.com/taskledger/taskledger/reactors"
)

// TestAlarmPointsAreCrashPoints: the alarm names its interruption points
// itself (a root package imports nothing of internal/); they must be the
// names a crash test sets in TASKLEDGER_CRASH_AT.
func TestAlarmPointsAreCrashPoints(t *testing.T) {
	for alarm, point := range map[string]string{
		reactors.CrashSlotAcquired:   crashpoint.SlotAcquired,
		reactors.CrashReleased:       crashpoint.Released,
		reactors.CrashPublished:      crashpoint.Published,
		reactors.CrashRetryScheduled: crashpoint.RetryScheduled,
	} {
		if alarm != point {
			t.Errorf("the alarm's point %q is crashpoint %q", alarm, point)
		}
	}
}
