package executor

import (
	"errors"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

// TestCheckWait: after a failed stop check the background check comes
// four times sooner.
func TestCheckWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		last CheckOutcome
		want time.Duration
	}{
		{CheckOutcome{}, 2 * time.Second},
		{CheckOutcome{Reason: api.ReasonActive}, 2 * time.Second},
		{CheckOutcome{Reason: api.ReasonCheckFailed}, 500 * time.Millisecond},
		{CheckOutcome{Err: errors.New("connection refused")}, 500 * time.Millisecond},
	} {
		if got := checkWait(2*time.Second, tc.last); got != tc.want {
			t.Errorf("checkWait after %+v = %v, want %v", tc.last, got, tc.want)
		}
	}
}
