package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/replay"
)

// schedulesCommand runs `taskledger schedules SUBCOMMAND`: create, list,
// show, pause, resume, trigger, delete, history.
func schedulesCommand(ctx context.Context, args []string, stdout io.Writer) error {
	const usage = "schedules create|list|show|pause|resume|trigger|delete|history"
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, usage)
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet("schedules " + sub)
	var cf clientFlags
	cf.register(fs)
	customer := fs.String("customer", "", "the schedule's customer (operator only)")
	switch sub {
	case "create":
		return scheduleCreate(ctx, fs, &cf, customer, args, stdout)
	case "list":
		after := fs.String("after", "", "the next cursor of the previous page")
		limit := fs.Int("limit", 0, "page size (default 100)")
		if err := parse(fs, args); err != nil {
			return err
		}
		l, err := cf.client().ListSchedules(ctx, *customer, *after, *limit)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, l)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCUSTOMER\tWHEN\tSTATE\tNEXT\tRUNS")
		for _, s := range l.Schedules {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", s.ID, s.CustomerID, scheduleWhen(s), scheduleState(s), nextOf(s), s.RunCount)
		}
		tw.Flush()
		if l.Next != "" {
			fmt.Fprintf(stdout, "next page: --after %s\n", l.Next)
		}
		return nil
	}
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	c, o := cf.client(), api.ScheduleOptions{CustomerID: *customer}
	var s api.Schedule
	switch sub {
	case "show":
		s, err = c.GetSchedule(ctx, id, o)
	case "pause":
		s, err = c.PauseSchedule(ctx, id, o)
	case "resume":
		s, err = c.ResumeSchedule(ctx, id, o)
	case "delete":
		s, err = c.DeleteSchedule(ctx, id, o)
	case "trigger":
		t, err := c.TriggerSchedule(ctx, id, o)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, t)
		}
		fmt.Fprintf(stdout, "triggered %s: task %s status=%s queue=%s\n", id, t.ID, t.Status, t.Queue)
		return nil
	case "history":
		h, err := c.ScheduleHistory(ctx, id, o)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, h)
		}
		entries := make([]replay.Entry, len(h.Events))
		for i, e := range h.Events {
			entries[i] = replay.Entry{Seq: events.Position(e.Seq), At: e.At, TaskID: e.TaskID, Type: e.Type, Actor: e.Actor, Status: e.Status, Detail: e.Detail, Data: e.Data}
		}
		return replay.WriteText(stdout, entries, false)
	default:
		return fmt.Errorf("%w: unknown subcommand %q: %s", errUsage, sub, usage)
	}
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, s)
	}
	printSchedule(stdout, s)
	return nil
}

func scheduleCreate(ctx context.Context, fs *flag.FlagSet, cf *clientFlags, customer *string, args []string, stdout io.Writer) error {
	var req api.ScheduleCreateRequest
	fs.StringVar(&req.Cron, "cron", "", "cron expression: 5 fields, or 6 with seconds first (or @daily, …)")
	fs.StringVar(&req.Every, "every", "", "or an interval, e.g. 30s, 1h")
	fs.StringVar(&req.Timezone, "timezone", "", "IANA zone the cron expression is read in (default UTC)")
	fs.StringVar(&req.Overlap, "overlap", "", "skip (default: no run while the previous is live) or allow")
	fs.StringVar(&req.Catchup, "catchup", "", "after downtime: one (default), none or all")
	fs.BoolVar(&req.Paused, "paused", false, "create it paused")
	fs.StringVar(&req.Task.Queue, "queue", "", "the runs' queue (default \"default\")")
	fs.StringVar(&req.Task.Repo, "repo", "", "repository the runs work on")
	text := fs.String("message", "", "the runs' objective (text)")
	timeout := fs.Duration("timeout", 0, "the runs' running timeout (default 1h)")
	var spec specFlags
	spec.register(fs)
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	req.ID, req.CustomerID = id, *customer
	req.Task.Labels, req.Task.Retry, req.Task.Concurrency = spec.labels.orNil(), spec.retryPolicy(), spec.concurrency()
	req.Task.Kind, req.Task.Payload = spec.kind, spec.payload
	if *text != "" {
		req.Task.Message.Content = []events.ContentPart{{Type: "text", Text: *text}}
	}
	req.Task.TimeoutSeconds = wholeSeconds(*timeout)
	s, created, err := cf.client().CreateSchedule(ctx, req)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, s)
	}
	verb := "created"
	if !created {
		verb = "exists (changed if the spec differed)"
	}
	fmt.Fprintf(stdout, "%s schedule %s  %s next=%s\n", verb, s.ID, scheduleWhen(s), nextOf(s))
	return nil
}

func scheduleWhen(s api.Schedule) string {
	if s.Cron != "" {
		return fmt.Sprintf("cron %q %s", s.Cron, s.Timezone)
	}
	return "every " + s.Every
}

func scheduleState(s api.Schedule) string {
	switch {
	case s.Deleted:
		return "deleted"
	case s.Paused:
		return "paused"
	}
	return "active"
}

func nextOf(s api.Schedule) string {
	if len(s.Next) == 0 {
		return "-"
	}
	return s.Next[0].Format(time.RFC3339)
}

func printSchedule(w io.Writer, s api.Schedule) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\ncustomer\t%s\nwhen\t%s\nstate\t%s\noverlap\t%s\ncatchup\t%s\nqueue\t%s\nruns\t%d\n",
		s.ID, s.CustomerID, scheduleWhen(s), scheduleState(s), s.Overlap, s.Catchup, s.Task.Queue, s.RunCount)
	if len(s.Task.Labels) > 0 {
		fmt.Fprintf(tw, "labels\t%s\n", labelFlag(s.Task.Labels))
	}
	if r := s.Task.Retry; r != nil && r.MaxAttempts != nil && r.BackoffSeconds != nil && r.MaxBackoffSeconds != nil {
		fmt.Fprintf(tw, "retry\t%d attempts, backoff %ds up to %ds, on %s\n", *r.MaxAttempts, *r.BackoffSeconds, *r.MaxBackoffSeconds, strings.Join(r.On, ","))
	}
	if c := s.Task.Concurrency; c != nil {
		fmt.Fprintf(tw, "concurrency\t%s (limit %d)\n", c.Key, c.Limit)
	}
	if s.Task.Kind != "" {
		fmt.Fprintf(tw, "kind\t%s\n", s.Task.Kind)
	}
	if len(s.Task.Payload) > 0 {
		fmt.Fprintf(tw, "payload\t%s\n", s.Task.Payload)
	}
	for i, n := range s.Next {
		label := ""
		if i == 0 {
			label = "next"
		}
		fmt.Fprintf(tw, "%s\t%s\n", label, n.Format(time.RFC3339))
	}
	tw.Flush()
	if len(s.Runs) == 0 {
		return
	}
	fmt.Fprintln(w, "\nlast runs (newest first):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tTASK\tSTATUS\tNOTE")
	for _, r := range s.Runs {
		note := r.Skipped
		if r.Manual {
			note = "trigger"
		}
		if r.Missed > 0 {
			note += fmt.Sprintf(" (%d missed before)", r.Missed)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.At.Format(time.RFC3339), or(r.TaskID, "-"), or(r.Status, "-"), note)
	}
	tw.Flush()
}

func or(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}
