package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/taskledger/taskledger/api"
)

// statsCommand prints GET /v1/stats: the log position and the alarm's
// lateness, then one line per customer and queue, per busy concurrency
// key and per live schedule.
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
	l := s.Alarm.Lateness
	fmt.Fprintf(stdout, "alarm lateness, last 5 min: p50 %.1fms p99 %.1fms max %.1fms (%d actions)\n", l.P50Seconds*1e3, l.P99Seconds*1e3, l.MaxSeconds*1e3, l.Samples)
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
	if len(s.Keys) > 0 {
		fmt.Fprintln(tw, "\nCUSTOMER\tKEY\tLIMIT\tHOLDERS\tWAITING")
		for _, k := range s.Keys {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\n", k.CustomerID, k.Key, k.Limit, k.Holders, k.Waiting)
		}
	}
	if len(s.Schedules) > 0 {
		fmt.Fprintln(tw, "\nCUSTOMER\tSCHEDULE\tNEXT\tLAST RUN\tRUNS")
		for _, sc := range s.Schedules {
			next, last := "paused", "-"
			if !sc.Paused {
				next = stamp(sc.Next)
			}
			if r := sc.LastRun; r != nil {
				last = stamp(r.At) + " " + r.TaskID + " " + r.Status
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", sc.CustomerID, sc.ID, next, last, sc.RunCount)
		}
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
	after := fs.String("after", "0", "start after this resume token: a stream sequence, or on a sharded log (and always for a customer token) an event's cursor (0: from the start of the log)")
	if err := parse(fs, args); err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	err := cf.client().StreamAfter(ctx, f, *after, func(e api.Event) error {
		if cf.json {
			return enc.Encode(e)
		}
		// A customer token's events carry no sequence: their cursor
		// (opaque) is what resumes after them.
		pos := strconv.FormatUint(e.Seq, 10)
		if e.Seq == 0 {
			pos = e.Cursor
		}
		_, err := fmt.Fprintf(stdout, "%s %s %s %s %s %s\n", pos, e.At.Format("2006-01-02T15:04:05.000Z"), e.TaskID, e.Type, e.Status, e.Detail)
		return err
	})
	if errors.Is(err, context.Canceled) {
		return nil // interrupted
	}
	return err
}
