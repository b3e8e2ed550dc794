//go:build !unix

package bench

import "time"

func processCPU() time.Duration { return 0 }

// fdBudget: no limit is known here.
func fdBudget() int { return 1 << 30 }
