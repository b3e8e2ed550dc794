package main

import (
	"bytes"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
)

func TestWarnFDLimit(t *testing.T) {
	t.Parallel()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	warned := func(maxConns int) bool {
		var buf bytes.Buffer
		warnFDLimit(zerolog.New(&buf), maxConns)
		return strings.Contains(buf.String(), "ulimit -n")
	}
	if !warned(int(lim.Cur)) {
		t.Fatalf("--max-conns %d with ulimit -n %d: no warning", lim.Cur, lim.Cur)
	}
	if warned(1) || warned(-1) {
		t.Fatal("a warning for --max-conns 1 or -1")
	}
}
