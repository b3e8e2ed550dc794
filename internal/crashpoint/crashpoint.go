//go:build !crashpoints

package crashpoint

// Hit marks the interruption point name. In a normal build it does
// nothing and costs nothing; a binary built with -tags crashpoints kills
// itself with SIGKILL at the point named by TASKLEDGER_CRASH_AT, so tests
// can prove recovery from a crash at each one.
func Hit(name string) {}
