//go:build !crashpoints

// Package crashpoint marks the interruption points of the delivery
// pipeline. In a normal build Hit does nothing and costs nothing; a binary
// built with -tags crashpoints kills itself with SIGKILL at the point
// named by TASKLEDGER_CRASH_AT, so tests can prove recovery from a crash
// at each one.
package crashpoint

// Hit marks the interruption point name.
func Hit(name string) {}
