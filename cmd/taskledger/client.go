package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/archive"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/replay"
)

// clientFlags are the flags every API subcommand shares.
type clientFlags struct {
	server, token string
	json          bool
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", "http://127.0.0.1:8080", "taskledger server URL")
	fs.StringVar(&c.token, "token", "", "bearer token; other local users see it in the process list: prefer --token-file or TASKLEDGER_TOKEN")
	fs.Var(tokenFile{&c.token}, "token-file", "read the bearer token from this file (its first line); of --token and --token-file the later on the command line wins, and either overrides TASKLEDGER_TOKEN and TASKLEDGER_TOKEN_FILE (of which the file wins)")
	fs.BoolVar(&c.json, "json", false, "print JSON")
}

// tokenFile is the --token-file flag: setting it reads the file's first
// line, trimmed of white space, into *token, so that it and --token
// override each other in the order parse sets them (environment
// variables first, TASKLEDGER_TOKEN before TASKLEDGER_TOKEN_FILE, then
// the command line left to right).
type tokenFile struct{ token *string }

// maxTokenFileBytes bounds what --token-file reads.
const maxTokenFileBytes = 64 << 10

func (f tokenFile) String() string { return "" }

func (f tokenFile) Set(path string) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, maxTokenFileBytes))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	if *f.token = strings.TrimSpace(line); *f.token == "" {
		return fmt.Errorf("%s: no token on its first line", path)
	}
	return nil
}

func (c *clientFlags) client() *api.Client { return api.NewClient(c.server, c.token) }

// oneID parses flags and requires exactly one positional argument.
func oneID(fs *flag.FlagSet, args []string) (string, error) {
	return oneArg(fs, args, "task id")
}

// oneArg parses flags and requires exactly one positional argument, what.
func oneArg(fs *flag.FlagSet, args []string, what string) (string, error) {
	// Accept flags after the argument too: taskledger show ID --json.
	var arg string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		arg, args = args[0], args[1:]
	}
	if err := parse(fs, args); err != nil {
		return "", err
	}
	if arg == "" && fs.NArg() == 1 {
		arg = fs.Arg(0)
	} else if arg == "" || fs.NArg() != 0 {
		return "", fmt.Errorf("%w: want exactly one %s", errUsage, what)
	}
	return arg, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func scheduleCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("schedule")
	var cf clientFlags
	cf.register(fs)
	var req api.ScheduleRequest
	fs.StringVar(&req.Queue, "queue", "", "queue (default \"default\")")
	fs.StringVar(&req.CustomerID, "customer", "", "customer id (operator only)")
	fs.StringVar(&req.ParentID, "parent", "", "parent task id")
	fs.StringVar(&req.RequestID, "request-id", "", "idempotency key: a repeat returns the existing task")
	fs.StringVar(&req.RelatedTaskID, "related", "", "id of a related (e.g. finished) task this one follows up")
	fs.StringVar(&req.Repo, "repo", "", "repository the task works on")
	var spec specFlags
	spec.register(fs)
	text := fs.String("message", "", "the task's objective (text)")
	delay := fs.Duration("delay", 0, "run after this delay (e.g. 30s)")
	runAt := fs.String("run-at", "", "run at this RFC 3339 time")
	timeout := fs.Duration("timeout", 0, "running timeout (default 1h)")
	file := fs.String("file", "", "schedule every task of this NDJSON file (one schedule body per line; - for stdin) in batches")
	err := parse(fs, args)
	if err != nil {
		return err
	}
	if *file != "" {
		return scheduleFile(ctx, cf, *file, stdout)
	}
	req.Labels, req.Retry, req.Concurrency = spec.labels.orNil(), spec.retryPolicy(), spec.concurrency()
	req.Kind, req.Payload = spec.kind, spec.payload
	if *text != "" {
		req.Message.Content = []events.ContentPart{{Type: "text", Text: *text}}
	}
	if *delay > 0 {
		d := delay.Seconds()
		req.DelaySeconds = &d
	}
	if req.RunAt, err = optionalTime("run-at", *runAt); err != nil {
		return err
	}
	req.TimeoutSeconds = wholeSeconds(*timeout)
	t, created, err := cf.client().Schedule(ctx, req)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, t)
	}
	verb := "scheduled"
	if !created {
		verb = "exists (same request id)"
	}
	fmt.Fprintf(stdout, "%s %s  status=%s queue=%s runAt=%s\n", verb, t.ID, t.Status, t.Queue, t.RunAt.Format(time.RFC3339))
	return nil
}

// specFlags are the flags of a task's labels, retry policy,
// concurrency limit, kind and payload, which schedule and schedules
// create share.
type specFlags struct {
	labels    labelFlag
	concKey   string
	concLimit int
	retry     api.RetryRequest
	kind      string
	payload   json.RawMessage
}

func (f *specFlags) register(fs *flag.FlagSet) {
	f.labels = labelFlag{}
	fs.Var(f.labels, "label", "a label key=value (repeat for several)")
	fs.StringVar(&f.concKey, "concurrency-key", "", "concurrency key: at most --concurrency-limit tasks with it hold a delivery or run at once")
	fs.IntVar(&f.concLimit, "concurrency-limit", 1, "slots of --concurrency-key (1-1000)")
	fs.Func("max-attempts", "attempts in all, 1 to 100 (default 1: no retry)", intFlag(&f.retry.MaxAttempts))
	fs.Func("backoff", "delay before the first retry, whole seconds (default 10s)", secondsFlag(&f.retry.BackoffSeconds))
	fs.Func("max-backoff", "longest delay between attempts, whole seconds (default 1h)", secondsFlag(&f.retry.MaxBackoffSeconds))
	fs.Func("retry-on", "what is retried: failed, timed_out or failed,timed_out (default failed)", func(v string) error {
		f.retry.On = strings.Split(v, ",")
		return nil
	})
	fs.StringVar(&f.kind, "kind", "", "the task's kind, for executors' typed handlers: 1-64 of [a-z0-9._-]")
	fs.Func("payload", "the task's payload: JSON, or @FILE (@- for stdin), at most 256 KiB compact", payloadFlag(&f.payload))
}

// retryPolicy is the policy the retry flags ask for: nil when none is
// given, else the given fields (the server fills the others).
func (f *specFlags) retryPolicy() *api.RetryRequest {
	if r := f.retry; r.MaxAttempts != nil || r.BackoffSeconds != nil || r.MaxBackoffSeconds != nil || r.On != nil {
		return &r
	}
	return nil
}

// concurrency is the limit --concurrency-key asks for; nil without one.
func (f *specFlags) concurrency() *events.Concurrency {
	if f.concKey == "" {
		return nil
	}
	return &events.Concurrency{Key: f.concKey, Limit: f.concLimit}
}

// intFlag sets *p to a flag's integer value.
func intFlag(p **int) func(string) error {
	return func(v string) error {
		n, err := strconv.Atoi(v)
		*p = &n
		return err
	}
}

// secondsFlag sets *p to a flag's duration in whole seconds.
func secondsFlag(p **int) func(string) error {
	return func(v string) error {
		d, err := time.ParseDuration(v)
		if err == nil && d != d.Truncate(time.Second) {
			err = errors.New("not a whole number of seconds")
		}
		n := int(d / time.Second)
		*p = &n
		return err
	}
}

func showCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("show")
	var cf clientFlags
	cf.register(fs)
	archiveDir := fs.String("archive", "", "the task's state replayed from this archive directory (taskledger archive) instead of a server's")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	var t api.Task
	if *archiveDir != "" {
		t, err = archivedTask(ctx, *archiveDir, id)
	} else {
		t, err = cf.client().Get(ctx, id)
	}
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, t)
	}
	printTask(stdout, t)
	return nil
}

// archivedTask is the task id as its events in the archive at dir leave
// it, rendered as the API does.
func archivedTask(ctx context.Context, dir, id string) (api.Task, error) {
	a, err := archive.Open(dir)
	if err != nil {
		return api.Task{}, err
	}
	evs, err := a.Task(ctx, id)
	if err != nil {
		return api.Task{}, err
	}
	if len(evs) == 0 {
		return api.Task{}, fmt.Errorf("task %s: not in the archive", id)
	}
	return httpapi.NewTask(aggregate.Replay(evs)), nil
}

func printTask(w io.Writer, t api.Task) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	row("id", t.ID)
	row("status", t.Status)
	row("reason", t.Reason)
	row("customer", t.CustomerID)
	row("queue", t.Queue)
	row("root", t.RootID)
	row("parent", t.ParentID)
	row("related", t.RelatedTaskID)
	row("retry of", t.RetryOf)
	row("labels", labelFlag(t.Labels).String())
	row("kind", t.Kind)
	row("payload", jsonText(t.Payload))
	row("request", t.RequestID)
	row("repo", t.Repo)
	if c := t.Concurrency; c != nil {
		row("concurrency", fmt.Sprintf("%s (limit %d)", c.Key, c.Limit))
	}
	row("waiting for", t.WaitingFor)
	row("message", messageText(t.Message.Content))
	row("created", stamp(t.CreatedAt))
	row("runAt", stamp(t.RunAt))
	row("started", stamp(t.StartedAt))
	row("completed", stamp(t.CompletedAt))
	row("deadline", stamp(t.Deadline))
	if t.Delivery != nil {
		row("delivery", fmt.Sprintf("%s (attempt %d)", t.Delivery.ID, t.Delivery.Attempt))
	}
	if t.Claim != nil {
		claim := t.Claim.ExecutorID
		if t.Claim.HeartbeatSeconds > 0 {
			claim += fmt.Sprintf(" (heartbeat every %ds)", t.Claim.HeartbeatSeconds)
		}
		row("claimed by", claim)
	}
	row("mailbox", fmt.Sprintf("%d messages, %d read", t.Mailbox.Count, t.Mailbox.Cursor))
	if r := t.Retry; r != nil {
		row("retry", fmt.Sprintf("attempt %d of %d, backoff %ds up to %ds, on %s", t.Attempt, t.MaxAttempts, r.BackoffSeconds, r.MaxBackoffSeconds, strings.Join(r.On, ",")))
	}
	if len(t.Attempts) > 1 || t.Retry != nil || t.Attempt > 1 {
		for _, a := range t.Attempts {
			row("attempt", strings.TrimSpace(fmt.Sprintf("%d %s by %s %s..%s %s", a.Attempt, a.Outcome, a.ExecutorID, stamp(a.StartedAt), stamp(a.EndedAt), a.Error)))
		}
	}
	if r := t.Result; r != nil {
		row("success", fmt.Sprint(r.Success))
		row("summary", r.Summary)
		row("error", r.Error)
		row("output", jsonText(r.Output))
	}
	// Every effect reported, the result's among them, as the task has it.
	for _, e := range t.Effects {
		row("effect", strings.TrimSpace(replay.EffectText(e)+"  "+stamp(e.At)))
	}
	row("version", fmt.Sprint(t.Version))
	tw.Flush()
}

func messageText(parts []events.ContentPart) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	s := strings.ReplaceAll(b.String(), "\n", " ")
	if len(s) > 100 {
		s = s[:97] + "..."
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func listCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("list")
	var cf clientFlags
	cf.register(fs)
	var o api.ListOptions
	fs.StringVar(&o.Status, "status", "", "only tasks with this status")
	fs.StringVar(&o.Queue, "queue", "", "only tasks of this queue")
	fs.StringVar(&o.CustomerID, "customer", "", "only tasks of this customer")
	fs.StringVar(&o.RootID, "root", "", "only tasks under this root")
	fs.StringVar(&o.IDPrefix, "id-prefix", "", "only tasks whose id starts with this")
	fs.StringVar(&o.After, "after", "", "cursor from a previous page")
	fs.IntVar(&o.Limit, "limit", 100, "page size (at most 1000)")
	fs.StringVar(&o.RequestID, "request-id", "", "only the task scheduled with this request id")
	fs.StringVar(&o.Kind, "kind", "", "only tasks of this kind")
	labels := labelFlag{}
	fs.Var(labels, "label", "only tasks with this label key=value (repeat: all of them, at most 4)")
	after := fs.String("created-after", "", "only tasks created after this RFC 3339 time")
	before := fs.String("created-before", "", "only tasks created before this RFC 3339 time")
	if err := parse(fs, args); err != nil {
		return err
	}
	o.Labels = labels.orNil()
	for _, b := range []struct {
		name, s string
		t       *time.Time
	}{{"created-after", *after, &o.CreatedAfter}, {"created-before", *before, &o.CreatedBefore}} {
		at, err := optionalTime(b.name, b.s)
		if err != nil {
			return err
		}
		if at != nil {
			*b.t = *at
		}
	}
	l, err := cf.client().List(ctx, o)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, l)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tQUEUE\tKIND\tCUSTOMER\tCREATED\tMESSAGE")
	for _, t := range l.Tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.40s\n", t.ID, t.Status, t.Queue, cmp.Or(t.Kind, "-"), t.CustomerID, stamp(t.CreatedAt), messageText(t.Message.Content))
	}
	tw.Flush()
	if l.Next != "" {
		fmt.Fprintf(stdout, "more: --after %s\n", l.Next)
	}
	return nil
}

func cancelCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("cancel")
	var cf clientFlags
	cf.register(fs)
	reason := fs.String("reason", "canceled from the command line", "why")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	t, err := cf.client().Cancel(ctx, id, *reason)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, t)
	}
	fmt.Fprintf(stdout, "%s %s\n", t.ID, t.Status)
	return nil
}

// releaseCommand hands a running task's current claim back (POST
// /v1/tasks/{id}/release with the claim's token, read first): an operator
// moves a task off a stuck executor without waiting for its heartbeat or
// deadline. The executor's next write is 409 claim_lost.
func releaseCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("release")
	var cf clientFlags
	cf.register(fs)
	reason := fs.String("reason", "released from the command line", "why (at most 1 KiB)")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	c := cf.client()
	t, err := c.Get(ctx, id)
	if err != nil {
		return err
	}
	if t.Status != "running" || t.Claim == nil {
		return fmt.Errorf("task %s is %s, not running: no claim to release", id, t.Status)
	}
	if t, err = c.Release(ctx, id, t.Claim.DeliveryID, *reason); err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, t)
	}
	fmt.Fprintf(stdout, "%s %s (attempt %d due now)\n", t.ID, t.Status, t.Attempt)
	return nil
}

func treeCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("tree")
	var cf clientFlags
	cf.register(fs)
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	tr, err := cf.client().Tree(ctx, id)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, tr)
	}
	var walk func(n api.Tree, prefix string)
	walk = func(n api.Tree, prefix string) {
		mark := ""
		if n.Task.ID == id {
			mark = "  <"
		}
		related := ""
		if n.Task.RelatedTaskID != "" {
			related = " related=" + n.Task.RelatedTaskID
		}
		fmt.Fprintf(stdout, "%s%s %s %.50s%s%s\n", prefix, n.Task.ID, n.Task.Status, messageText(n.Task.Message.Content), related, mark)
		for _, c := range n.Children {
			walk(c, prefix+"  ")
		}
	}
	walk(tr, "")
	return nil
}

func concurrencyCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("concurrency")
	var cf clientFlags
	cf.register(fs)
	customer := fs.String("customer", "", "customer id (operator only)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: concurrency KEY", errUsage)
	}
	k, err := cf.client().Concurrency(ctx, fs.Arg(0), *customer)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, k)
	}
	fmt.Fprintf(stdout, "key %q of customer %s: %d holding, %d waiting\n", k.Key, k.CustomerID, len(k.Holders), len(k.Waiters))
	for _, h := range k.Holders {
		fmt.Fprintf(stdout, "holds  %s  status=%s\n", h.TaskID, h.Status)
	}
	for _, w := range k.Waiters {
		fmt.Fprintf(stdout, "waits  %s  runAt=%s\n", w.TaskID, stamp(w.RunAt))
	}
	return nil
}

// wholeSeconds is a --timeout flag as a request's timeoutSeconds: nil
// (the server's default) when it is not set.
func wholeSeconds(d time.Duration) *int {
	if d <= 0 {
		return nil
	}
	n := int(d.Seconds())
	return &n
}
