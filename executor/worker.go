package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/ready"
)

// API is the scheduler as an executor uses it. The scheduler stays the
// only writer of the log, so an executor needs no write access to it.
type API interface {
	ClaimNext(ctx context.Context, queue, executorID string, wait time.Duration, opts ...api.ClaimOption) (api.Task, bool, error)
	ClaimBatch(ctx context.Context, queue, executorID string, max int, wait time.Duration, opts ...api.ClaimOption) ([]api.Task, error)
	Claim(ctx context.Context, id, deliveryID, executorID string, opts ...api.ClaimOption) (api.Task, error)
	// Check asks whether to stop; with the claim's deliveryID it
	// consumes the mailbox messages it returns (api.Client.Check).
	Check(ctx context.Context, id, deliveryID string) (api.Check, error)
	RecordResult(ctx context.Context, id string, r api.ResultRequest) (api.Task, error)
	Cancel(ctx context.Context, id, reason string) (api.Task, error)
	Schedule(ctx context.Context, req api.ScheduleRequest) (api.Task, bool, error)
	Get(ctx context.Context, id string) (api.Task, error)
	Mailbox(ctx context.Context, id string, after int) (api.Mail, error)
}

var _ API = (*api.Client)(nil)

// LivenessAPI is the part of the scheduler's API that keeps claims alive
// and hands them back (POST /v1/tasks/{id}/heartbeat and release).
// *api.Client implements it; a worker whose API does not claims without
// heartbeats.
type LivenessAPI interface {
	Heartbeat(ctx context.Context, id, deliveryID string) (api.Renewal, error)
	Release(ctx context.Context, id, deliveryID, reason string) (api.Task, error)
}

var _ LivenessAPI = (*api.Client)(nil)

// DefaultHeartbeatSeconds is the heartbeat interval of a worker's claims
// unless WorkerConfig.HeartbeatSeconds says otherwise.
const DefaultHeartbeatSeconds = 30

// ReasonClaimLost is the StopReason of a run whose claim was lost (a
// missed heartbeat) or released: another executor may hold the task.
const ReasonClaimLost = "claim_lost"

// Handler runs one claimed task. It returns a summary for the result; a
// nil error reports success, any other error failure. It should return
// promptly once ctx is cancelled (a stop check said stop, or the worker
// is shutting down).
type Handler func(ctx context.Context, run *Run) (summary string, err error)

// WorkerConfig configures a Worker. API is required.
type WorkerConfig struct {
	API   API
	Queue string // default events.DefaultQueue
	// ExecutorID names this executor in claims. Keep it stable across
	// restarts: a restarted executor resumes the runs its checkpoints say
	// it holds. Default: the host name.
	ExecutorID  string
	Concurrency int // tasks run at once; default 4
	// JS, if set, takes ready notifications from the ready stream's
	// durable pull consumer shared by the pool (and the scheduler's
	// claims/next); otherwise the worker long-polls POST /v1/claims/next
	// (or POST /v1/claims) through API, over HTTP or over NATS.
	JS          jetstream.JetStream
	ReadyStream string          // default events.ReadyStreamName(events.DefaultStream)
	Subjects    events.Subjects // default tl.*
	// Checkpoints keeps the runs' progress. Default: the scheduler's run
	// routes (SchedulerRuns) when API implements RunAPI, as *api.Client
	// does; otherwise in memory, which survives no restart.
	Checkpoints CheckpointStore
	// CheckInterval is the period of the background stop check; default
	// 2s, a quarter of it after a check that failed (CheckOutcome.Failed).
	CheckInterval time.Duration
	PollWait      time.Duration // long poll of claims/next; default 30s
	Logger        zerolog.Logger

	// HeartbeatSeconds is the heartbeat interval the worker's claims
	// declare when API implements LivenessAPI (as *api.Client does): the
	// worker renews each claim every third of it, so a claim is lost
	// (and its task handed to another executor, which resumes its Run)
	// about one interval after this process dies. A run whose claim is
	// lost stops with ReasonClaimLost. Default DefaultHeartbeatSeconds;
	// -1: claims without heartbeats, held until their deadline.
	HeartbeatSeconds int
	// KeepClaimsOnShutdown keeps the claims of the runs in progress when
	// Run's ctx ends, for a restarted worker with the same ExecutorID to
	// resume (within a heartbeat interval). By default the worker releases
	// them (LivenessAPI.Release): their tasks are claimable again at once,
	// by any executor, which resumes their Runs, and the attempt is not
	// charged against their retry policy.
	KeepClaimsOnShutdown bool
}

// Worker claims tasks from one queue and runs a Handler on each, with
// bounded concurrency.
type Worker struct {
	cfg           WorkerConfig
	handler       Handler
	kinds         kindHandlers // typed handlers by kind (Handle)
	checkFailures atomic.Int64
	live          LivenessAPI // nil: claims without heartbeats
	claim         []api.ClaimOption
}

// CheckFailures counts the stop checks of this worker's runs that could
// not tell whether to stop (CheckOutcome.Failed): each went on
// fail-open. Safe for concurrent use.
func (w *Worker) CheckFailures() int64 { return w.checkFailures.Load() }

// checkWait is how long the background check waits after last: the
// interval, a quarter of it after a failed check.
func checkWait(interval time.Duration, last CheckOutcome) time.Duration {
	if last.Failed() {
		return interval / 4
	}
	return interval
}

// NewWorker returns a worker running h on each task (but those of a kind
// with a typed handler, Handle); Run starts it. cfg.API is required; h
// may be nil for a worker whose tasks all have typed handlers.
func NewWorker(cfg WorkerConfig, h Handler) (*Worker, error) {
	if cfg.API == nil {
		return nil, errors.New("executor: WorkerConfig.API is required")
	}
	if cfg.Queue == "" {
		cfg.Queue = events.DefaultQueue
	}
	if cfg.ExecutorID == "" {
		host, _ := os.Hostname()
		cfg.ExecutorID = "executor-" + host
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.ReadyStream == "" {
		cfg.ReadyStream = events.ReadyStreamName(events.DefaultStream)
	}
	if cfg.Subjects.Root == "" {
		cfg.Subjects = events.DefaultSubjects
	}
	if cfg.Checkpoints == nil {
		if ra, ok := cfg.API.(RunAPI); ok {
			cfg.Checkpoints = NewSchedulerRuns(ra, cfg.Queue, cfg.ExecutorID)
		} else {
			cfg.Checkpoints = &MemoryCheckpoints{}
		}
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = 2 * time.Second
	}
	if cfg.PollWait <= 0 {
		cfg.PollWait = 30 * time.Second
	}
	if cfg.HeartbeatSeconds == 0 {
		cfg.HeartbeatSeconds = DefaultHeartbeatSeconds
	}
	if cfg.HeartbeatSeconds > events.MaxHeartbeatSeconds {
		return nil, fmt.Errorf("executor: HeartbeatSeconds %d is over %d", cfg.HeartbeatSeconds, events.MaxHeartbeatSeconds)
	}
	w := &Worker{cfg: cfg, handler: h}
	if live, ok := cfg.API.(LivenessAPI); ok && cfg.HeartbeatSeconds > 0 {
		w.live, w.claim = live, []api.ClaimOption{api.WithHeartbeat(cfg.HeartbeatSeconds)}
	}
	return w, nil
}

// Run resumes the runs this executor's checkpoints hold, then claims and
// runs tasks until ctx ends. Runs in progress at shutdown are not
// reported: their claims are released for any executor to resume their
// Runs (unless KeepClaimsOnShutdown: then a restarted worker with the
// same ExecutorID resumes them from their checkpoints).
func (w *Worker) Run(ctx context.Context) error {
	slots := make(chan struct{}, w.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	start := func(t api.Task, cp Checkpoint) {
		r := &Run{Task: t, w: w, cp: cp} // the goroutine holds this, not copies of t and cp
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			w.execute(ctx, r)
		}()
	}
	if err := w.resume(ctx, slots, start); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while resuming
		}
		return err
	}
	// next claims up to free tasks (at least one slot is free).
	next := w.pollHTTP
	if w.cfg.JS != nil {
		cons, err := w.cfg.JS.CreateOrUpdateConsumer(ctx, w.cfg.ReadyStream, ready.ConsumerConfig(w.cfg.Subjects, w.cfg.Queue, 0))
		if ctx.Err() != nil {
			return nil // stopped before the first claim
		}
		if err != nil {
			return fmt.Errorf("ready consumer: %w", err)
		}
		next = func(ctx context.Context, _ int) ([]api.Task, error) { return w.pollNATS(ctx, cons) }
	}
	backoff := 100 * time.Millisecond
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		free := 1
	more:
		for free < cap(slots) { // take every other free slot too
			select {
			case slots <- struct{}{}:
				free++
			default:
				break more
			}
		}
		tasks, err := next(ctx, free)
		if err != nil && ctx.Err() == nil {
			w.cfg.Logger.Warn().Err(err).Str("queue", w.cfg.Queue).Msg("claiming failed; retrying")
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			backoff = min(2*backoff, 5*time.Second)
		} else {
			backoff = 100 * time.Millisecond
		}
		for _, t := range tasks {
			start(t, w.attemptCheckpoint(ctx, t))
		}
		for range free - len(tasks) {
			<-slots
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// resume restarts the runs this executor still holds: checkpoints not
// done whose task is still running under the same claim.
func (w *Worker) resume(ctx context.Context, slots chan struct{}, start func(api.Task, Checkpoint)) error {
	cps, err := w.cfg.Checkpoints.List(ctx)
	if err != nil {
		return fmt.Errorf("listing checkpoints: %w", err)
	}
	for _, cp := range cps {
		if cp.ExecutorID != w.cfg.ExecutorID {
			continue
		}
		t, err := w.cfg.API.Get(ctx, cp.TaskID)
		if err != nil && !errors.Is(err, api.ErrNotFound) {
			// No answer about the task: keep the checkpoint for a later start.
			w.cfg.Logger.Warn().Err(err).Str("task", cp.TaskID).Msg("cannot look up a checkpointed run; not resumed now")
			continue
		}
		if err != nil || t.Status != api.StatusRunning || t.Claim == nil || t.Claim.DeliveryID != cp.DeliveryID {
			cp.Done = true // nothing left to resume
			w.cfg.Checkpoints.Save(ctx, cp)
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		w.cfg.Logger.Info().Str("task", t.ID).Int("steps", len(cp.Steps)).Msg("resuming run from checkpoint")
		start(t, cp)
	}
	return nil
}

// pollHTTP long-polls for up to free tasks: claims/next for one, a batch
// claim for more.
func (w *Worker) pollHTTP(ctx context.Context, free int) ([]api.Task, error) {
	if free > 1 {
		return w.cfg.API.ClaimBatch(ctx, w.cfg.Queue, w.cfg.ExecutorID, min(free, api.MaxBatchItems), w.cfg.PollWait, w.claim...)
	}
	t, ok, err := w.cfg.API.ClaimNext(ctx, w.cfg.Queue, w.cfg.ExecutorID, w.cfg.PollWait, w.claim...)
	if !ok {
		return nil, err
	}
	return []api.Task{t}, err
}

// pollNATS takes one ready notification and claims its task. A rejected
// claim is normal (another executor won, or the notification is stale)
// and silent.
func (w *Worker) pollNATS(ctx context.Context, cons jetstream.Consumer) ([]api.Task, error) {
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(min(w.cfg.PollWait, time.Second)))
	if err != nil {
		return nil, err
	}
	for msg := range batch.Messages() {
		n, err := events.UnmarshalReady(msg.Data(), msg.Headers().Get(events.ContentTypeHeader))
		if err != nil {
			msg.Term()
			continue
		}
		t, err := w.cfg.API.Claim(ctx, n.TaskID, n.DeliveryID, w.cfg.ExecutorID, w.claim...)
		switch {
		case err == nil:
			msg.Ack()
			return []api.Task{t}, nil
		case lostClaim(err):
			msg.Ack()
		default:
			msg.Nak()
			return nil, err
		}
	}
	return nil, nil
}

// lostClaim reports whether a claim was refused because the task moved
// on: another executor won, the notification was stale, the task ended or
// is gone, or an ancestor ended (the claim canceled it instead).
func lostClaim(err error) bool {
	return errors.Is(err, api.ErrTokenMismatch) || errors.Is(err, api.ErrNotClaimable) ||
		errors.Is(err, api.ErrTerminal) || errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrAncestorTerminal)
}

// execute runs the handler on one claimed task and reports its result.
func (w *Worker) execute(ctx context.Context, r *Run) {
	t := r.Task // a copy: what the handler does to r.Task changes no report
	// Each line names the task; its fields are built only when a line is
	// written (a logger With the task would cost every run its buffer).
	log := &w.cfg.Logger
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.ctx, r.cancel = runCtx, cancel
	if t.Mailbox.Count > 0 {
		// Resumed, or mail came before the claim: the transcript keeps
		// message ids only, so reload the content, and let messages
		// handed out but not yet in the transcript join it now.
		if mail, err := w.cfg.API.Mailbox(ctx, t.ID, 0); err == nil {
			r.receive(mail.Messages)
		}
	}
	if err := r.save(ctx); err != nil {
		log.Warn().Str("task", t.ID).Err(err).Msg("checkpoint not saved")
	}
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		w.heartbeat(runCtx, r)
	}()
	checking := make(chan struct{})
	go func() {
		defer close(checking)
		next := time.NewTimer(w.cfg.CheckInterval)
		defer next.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-next.C:
				r.Check(runCtx)
				next.Reset(checkWait(w.cfg.CheckInterval, r.LastCheck()))
			}
		}
	}()
	summary, err := w.handle(runCtx, r)
	cancel()
	<-checking
	<-beating

	bg := context.WithoutCancel(ctx)
	switch {
	case r.StopReason() == ReasonClaimLost:
		// Another executor may hold the task and resume the Run: leave
		// both alone.
		log.Warn().Str("task", t.ID).Msg("claim lost; run stopped")
		return
	case r.stopped():
		if r.StopReason() == api.ReasonAncestorTerminal {
			if _, err := w.cfg.API.Cancel(bg, t.ID, "an ancestor task is terminal"); err != nil {
				log.Warn().Str("task", t.ID).Err(err).Msg("cancel after ancestor stop")
			}
		}
		log.Info().Str("task", t.ID).Str("reason", r.StopReason()).Msg("run stopped")
	case ctx.Err() != nil && w.live != nil && !w.cfg.KeepClaimsOnShutdown:
		rctx, rcancel := context.WithTimeout(bg, releaseTimeout)
		defer rcancel()
		if _, err := w.live.Release(rctx, t.ID, t.Claim.DeliveryID, "executor "+w.cfg.ExecutorID+" shutting down"); err != nil {
			log.Warn().Str("task", t.ID).Err(err).Msg("worker shutting down; claim not released (it is lost after its heartbeat interval)")
		} else {
			log.Info().Str("task", t.ID).Msg("worker shutting down; claim released for another executor to resume")
		}
		return
	case ctx.Err() != nil:
		log.Info().Str("task", t.ID).Msg("worker shutting down; run left to resume")
		return
	default:
		// Cut to the server's limits: a result over them would be refused.
		res := api.ResultRequest{DeliveryID: t.Claim.DeliveryID, Success: err == nil,
			Summary: events.Truncate(summary, events.MaxSummaryBytes), Effects: r.effects(), Output: r.resultOutput()}
		if err != nil {
			res.Error = events.Truncate(err.Error(), events.MaxErrorBytes)
		}
		if perr := (*PayloadError)(nil); errors.As(err, &perr) {
			res.Retryable = new(bool) // the same payload fails again
		}
		if len(res.Effects) > events.MaxEffects {
			res.Effects = res.Effects[:events.MaxEffects]
		}
		if _, rerr := w.cfg.API.RecordResult(bg, t.ID, res); rerr != nil {
			log.Warn().Str("task", t.ID).Err(rerr).Msg("result not recorded")
		}
	}
	r.Update(bg, func(cp *Checkpoint) { cp.Done = true })
}

// attemptCheckpoint is the checkpoint a freshly claimed task starts
// from: empty on its first attempt; on a retry (docs/API.md, "Retries")
// the previous attempt's, if the store still holds it, continued under
// the new claim, so completed steps and settled effects are not redone.
func (w *Worker) attemptCheckpoint(ctx context.Context, t api.Task) Checkpoint {
	fresh := Checkpoint{TaskID: t.ID, DeliveryID: t.Claim.DeliveryID, RunState: api.RunState{ExecutorID: w.cfg.ExecutorID}}
	if t.Attempt <= 1 {
		return fresh
	}
	cp, ok, err := w.cfg.Checkpoints.Load(ctx, t.ID)
	if err != nil {
		w.cfg.Logger.Warn().Err(err).Str("task", t.ID).Msg("previous attempt's checkpoint not loaded; starting afresh")
	}
	if !ok || err != nil {
		return fresh
	}
	if cp.DeliveryID != "" && cp.DeliveryID != t.Claim.DeliveryID && !cp.hasItem(handoverID(t.Claim.DeliveryID)) {
		cp.Transcript = append(cp.Transcript, api.TranscriptItem{
			ID: handoverID(t.Claim.DeliveryID), Kind: api.ItemHandover, Turn: cp.Turn, At: time.Now().UTC(),
			Content: []events.ContentPart{{Type: "text", Text: fmt.Sprintf(
				"attempt %d: executor %s took the Run over under delivery %s from executor %s (delivery %s), at turn %d",
				t.Attempt, w.cfg.ExecutorID, t.Claim.DeliveryID, orUnknown(cp.ExecutorID), cp.DeliveryID, cp.Turn)}},
		})
	}
	cp.TaskID, cp.DeliveryID, cp.Done = t.ID, t.Claim.DeliveryID, false
	cp.ExecutorID = w.cfg.ExecutorID
	return cp
}

// handoverID is the transcript id of the hand-over to the claim under
// deliveryID (api.ItemHandover).
func handoverID(deliveryID string) string { return "handover-" + deliveryID }

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// releaseTimeout bounds the release of a claim at shutdown.
const releaseTimeout = 10 * time.Second

// heartbeat renews r's claim every third of its heartbeat interval until
// ctx ends; it does nothing for a claim without heartbeats. A claim the
// scheduler says is lost (or no longer r's) stops the run; any other
// failure is logged and the next beat comes sooner, at a tenth of the
// interval, so a passing fault does not cost the claim; one that lasts
// four fifths of the interval stops the run (ReasonClaimLost) before the
// scheduler may give its task to another executor.
func (w *Worker) heartbeat(ctx context.Context, r *Run) {
	t := r.Task
	if w.live == nil || t.Claim == nil || t.Claim.HeartbeatSeconds <= 0 {
		return
	}
	interval := time.Duration(t.Claim.HeartbeatSeconds) * time.Second
	// The scheduler counts the interval from when a renewal reached it,
	// which is after it was sent: a run whose last answered renewal was
	// sent fenceAfter ago stops itself before the claim can be lost and
	// its task handed to another executor (fenced), so it never runs
	// beside its successor, however the heartbeats fail.
	fenceAfter := interval * 4 / 5
	renewed := time.Now() // the claim, as far as this run knows
	next := interval / 3
	for {
		fence := renewed.Add(fenceAfter)
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(next, time.Until(fence))):
		}
		if !time.Now().Before(fence) {
			w.cfg.Logger.Warn().Str("task", t.ID).Dur("since", time.Since(renewed)).
				Msg("claim not renewed in time; stopping the run before the scheduler may hand its task on")
			r.stop(ReasonClaimLost)
			return
		}
		sent := time.Now()
		hctx, cancel := context.WithDeadline(ctx, fence)
		_, err := w.live.Heartbeat(hctx, t.ID, t.Claim.DeliveryID)
		cancel()
		switch {
		case err == nil:
			renewed, next = sent, interval/3
		case errors.Is(err, api.ErrClaimLost):
			r.stop(ReasonClaimLost)
			return
		case errors.Is(err, api.ErrTokenMismatch), errors.Is(err, api.ErrTerminal), errors.Is(err, api.ErrNotFound):
			r.stop(ReasonSuperseded)
			return
		case ctx.Err() != nil:
			return
		default:
			w.cfg.Logger.Warn().Err(err).Str("task", t.ID).Msg("heartbeat failed; trying again sooner")
			next = interval / 10
		}
	}
}

// handle runs the handler of the task's kind (handlerFor), turning a
// panic into a failure.
func (w *Worker) handle(ctx context.Context, r *Run) (summary string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("handler panicked: %v", v)
		}
	}()
	return w.handlerFor(r.Task.Kind)(ctx, r)
}

// ReadyConsumerIdle is ready.ConsumerIdle.
//
// Deprecated: the ready queue's wire contract moved to package ready; use
// ready.ConsumerIdle.
const ReadyConsumerIdle = ready.ConsumerIdle

// ReadyConsumerConfig is ready.ConsumerConfig.
//
// Deprecated: the ready queue's wire contract moved to package ready; use
// ready.ConsumerConfig.
func ReadyConsumerConfig(subjects events.Subjects, queue string, ackWait time.Duration) jetstream.ConsumerConfig {
	return ready.ConsumerConfig(subjects, queue, ackWait)
}
