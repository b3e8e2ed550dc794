package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/taskledger/taskledger/api"
)

// statsCommand prints GET /v1/stats: the log position, then one line per
// customer and queue.
func statsCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("stats")
	var cf clientFlags
	cf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	s, err := cf.client().Stats(ctx)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, s)
	}
	fmt.Fprintf(stdout, "applied %d of %d (lag %d, caught up %v)\n", s.Applied, s.LastSeq, s.Lag, s.CaughtUp)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CUSTOMER\tQUEUE\tCOUNTS\tOLDEST QUEUED\tCLAIMS/S 1M 5M\tRESULTS/S 1M 5M\tNEAR TIMEOUT\tRETRIES\tREJECTIONS")
	for _, q := range s.Queues {
		counts := make([]string, 0, len(q.Counts))
		for st, n := range q.Counts {
			counts = append(counts, fmt.Sprintf("%s=%d", st, n))
		}
		sort.Strings(counts)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1fs\t%.2f %.2f\t%.2f %.2f\t%d\t%d\t%d\n", q.CustomerID, q.Queue, strings.Join(counts, ","),
			q.OldestQueuedSeconds, q.Claims.Last1m, q.Claims.Last5m, q.Results.Last1m, q.Results.Last5m, q.NearTimeout, q.Retries, q.Rejections)
	}
	return tw.Flush()
}

// eventsCommand follows GET /v1/events/stream, one line per event (or
// one JSON event per line with --json), until interrupted.
func eventsCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("events")
	var cf clientFlags
	cf.register(fs)
	var f api.StreamFilter
	list := func(name, usage string, to *[]string) {
		fs.Func(name, usage+" (repeatable or comma separated)", func(v string) error {
			*to = append(*to, strings.Split(v, ",")...)
			return nil
		})
	}
	list("task", "only this task's events", &f.TaskIDs)
	list("root", "only the events of this lineage", &f.RootIDs)
	list("queue", "only the events of tasks on this queue", &f.Queues)
	list("type", "only events of this type", &f.Types)
	after := fs.Uint64("after", 0, "start after this stream sequence (0: from the start of the log)")
	if err := parse(fs, args); err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	err := cf.client().Stream(ctx, f, *after, func(e api.Event) error {
		if cf.json {
			return enc.Encode(e)
		}
		_, err := fmt.Fprintf(stdout, "%d %s %s %s %s %s\n", e.Seq, e.At.Format("2006-01-02T15:04:05.000Z"), e.TaskID, e.Type, e.Status, e.Detail)
		return err
	})
	if errors.Is(err, context.Canceled) {
		return nil // interrupted
	}
	return err
}
