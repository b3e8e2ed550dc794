package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// labelFlag collects repeated --label key=value flags.
type labelFlag map[string]string

func (l labelFlag) String() string {
	pairs := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		pairs = append(pairs, k+"="+l[k])
	}
	return strings.Join(pairs, ",")
}

func (l labelFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("want key=value, got %q", s)
	}
	if _, dup := l[k]; dup {
		return fmt.Errorf("label %q given twice", k)
	}
	l[k] = v
	return nil
}

// orNil returns the labels, nil for none.
func (l labelFlag) orNil() map[string]string {
	if len(l) == 0 {
		return nil
	}
	return l
}

// optionalTime parses the RFC 3339 value s of flag --name; nil for "".
func optionalTime(name, s string) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, fmt.Errorf("%w: --%s: %w", errUsage, name, err)
	}
	return &t, nil
}

func retryCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("retry")
	var cf clientFlags
	cf.register(fs)
	var req api.RetryTaskRequest
	fs.StringVar(&req.RequestID, "request-id", "", "idempotency key: a repeat returns the task the first retry made")
	text := fs.String("message", "", "a new objective (text); default the retried task's")
	runAt := fs.String("run-at", "", "run at this RFC 3339 time (default now)")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	if *text != "" {
		req.Message = &events.Message{Content: []events.ContentPart{{Type: "text", Text: *text}}}
	}
	if req.RunAt, err = optionalTime("run-at", *runAt); err != nil {
		return err
	}
	t, created, err := cf.client().RetryTask(ctx, id, req)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, t)
	}
	verb := "retried"
	if !created {
		verb = "exists (same request id)"
	}
	fmt.Fprintf(stdout, "%s %s as %s  status=%s queue=%s runAt=%s\n", verb, id, t.ID, t.Status, t.Queue, t.RunAt.Format(time.RFC3339))
	return nil
}
