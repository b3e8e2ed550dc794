// Package testlog is a log sink for tests: a buffer that a logger's (or a
// child process's) goroutines write while the test reads it.
package testlog

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines returns the non-empty lines written so far.
func (b *Buffer) Lines() []string {
	var out []string
	for _, line := range strings.Split(b.String(), "\n") {
		if line != "" {
			out = append(out, line)
		}
	}
	return out
}
