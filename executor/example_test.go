package executor_test

import (
	"context"
	"log"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// The README's Go SDK example: a worker that plans, opens a pull request
// at most once (even across crashes), delegates a review to a child task
// and waits for its verdict.
func Example() {
	ctx := context.Background()
	w, err := executor.NewWorker(executor.WorkerConfig{
		API: api.NewClient("http://127.0.0.1:8080", token), Queue: "default", ExecutorID: "w1",
		// JS + Checkpoints: executor.OpenKVCheckpoints(ctx, js, "") to resume after a restart
	}, func(ctx context.Context, run *executor.Run) (string, error) {
		if err := run.Step(ctx, "plan", plan); err != nil { // checks stop first; skipped when resumed
			return "", err
		}
		pr, err := run.Effect(ctx, "open-pr", openPR, findPRByBranch) // at most once, even across crashes
		if err != nil {
			return "", err
		}
		child, err := run.Delegate(ctx, "review", api.ScheduleRequest{Queue: "review"}) // same key → same child
		if err != nil {
			return "", err
		}
		verdict, err := run.Await(ctx, child.ID) // from the mailbox
		return "opened " + pr.URL + ", review " + verdict.Status, err
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

const token = "" // the server's bearer token, if it has an auth file

func plan(ctx context.Context) error { return nil }

func openPR(ctx context.Context) (events.Effect, error) {
	return events.Effect{Kind: "pull_request", Ref: "42", URL: "https://example.com/pr/42"}, nil
}

func findPRByBranch(ctx context.Context) (events.Effect, bool, error) {
	return events.Effect{}, false, nil
}
