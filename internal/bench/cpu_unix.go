//go:build unix

package bench

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user and system) this process has
// used so far, embedded NATS server included; 0 where unknown.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fdBudget raises the open-file limit as far as the process may and
// returns how many descriptors are left beyond a reserve for the server.
func fdBudget() int {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return 1 << 30
	}
	want := max(lim.Cur, 1<<16)
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}) != nil {
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim.Max, Max: lim.Max})
	}
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return max(int(lim.Cur)-2000, 0)
}
