//go:build crashpoints

package crashpoint

import (
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
)

var (
	at = os.Getenv("TASKLEDGER_CRASH_AT")
	// after skips the first TASKLEDGER_CRASH_AFTER hits, so traffic is
	// under way when the process dies.
	after, _ = strconv.ParseInt(os.Getenv("TASKLEDGER_CRASH_AFTER"), 10, 64)
	hits     atomic.Int64
)

// Hit kills the process with SIGKILL when name is the configured point and
// it has been hit more than TASKLEDGER_CRASH_AFTER times.
func Hit(name string) {
	if name != at || hits.Add(1) <= after {
		return
	}
	os.Stderr.WriteString("crashpoint: killing the process at " + name + "\n")
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
