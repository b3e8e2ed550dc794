package executor_test

import (
	"context"
	"encoding/json"
	"log"
	"slices"
	"strings"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// The Go SDK example of docs/executors.md: a worker that plans, opens a pull request
// at most once (even across crashes), delegates a review to a child task
// and waits for its verdict.
func Example() {
	ctx := context.Background()
	w, err := executor.NewWorker(executor.WorkerConfig{
		API: api.NewClient("http://127.0.0.1:8080", token), Queue: "default", ExecutorID: "w1",
		// the run's progress is saved in the scheduler (PUT /v1/tasks/{id}/run): a restart resumes it
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

// A model loop in Turns: each Turn records the model's input and answer
// and runs the tool the answer asks for. Restarted after a crash, the
// worker resumes the run: finished Turns are skipped, a cut-off one
// answers from the saved transcript, and a tool cut off mid-call is not
// called again (it settles as uncertain; give Dispatch a lookup to find
// out instead).
func ExampleRun_Turn() {
	w, err := executor.NewWorker(executor.WorkerConfig{
		API: api.NewClient("http://127.0.0.1:8080", token), Queue: "agents", ExecutorID: "agent-1",
	}, agent)
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// agent runs Turns until the model answers without asking for a tool. It
// reads where it stands from the saved Run, so a resumed run that skips
// its finished Turns still knows when it is done.
func agent(ctx context.Context, run *executor.Run) (string, error) {
	for {
		if answer, ok := lastOutput(run.State()); ok && !strings.HasPrefix(answer, "tool:") {
			return answer, nil
		}
		err := run.Turn(ctx, func(t *executor.Turn) error {
			in, err := t.Record(ctx, api.TranscriptItem{Kind: api.ItemModelInput, Content: text(prompt(run))})
			if err != nil {
				return err
			}
			out, err := t.Record(ctx, api.TranscriptItem{Kind: api.ItemModelOutput, Content: text(model(in.Content[0].Text))})
			if err != nil {
				return err
			}
			name, ok := strings.CutPrefix(out.Content[0].Text, "tool:")
			if !ok {
				return nil // the answer: this Turn is the last
			}
			_, err = t.Dispatch(ctx, api.ToolCall{Name: name}, func(ctx context.Context) (json.RawMessage, error) {
				return json.RawMessage(`"main.go:12"`), nil // run the tool
			}, nil)
			return err
		})
		if err != nil {
			return "", err
		}
	}
}

// prompt is the model's next input: the task's message, then the last
// tool result.
func prompt(run *executor.Run) string {
	for _, it := range slices.Backward(run.State().Transcript) {
		if it.Kind == api.ItemToolResult {
			return it.Tool.Name + " said " + string(it.Tool.Output)
		}
	}
	return run.Task.Message.Content[0].Text
}

// model stands in for a model call: it asks for grep, then answers.
func model(input string) string {
	if strings.HasPrefix(input, "grep said") {
		return "fixed the bug at " + strings.TrimPrefix(input, "grep said ")
	}
	return "tool:grep"
}

// lastOutput returns the text of the run's last model output.
func lastOutput(r api.RunState) (string, bool) {
	for _, it := range slices.Backward(r.Transcript) {
		if it.Kind == api.ItemModelOutput {
			return it.Content[0].Text, true
		}
	}
	return "", false
}

func text(s string) []events.ContentPart { return []events.ContentPart{{Type: "text", Text: s}} }

// A worker with a typed handler per kind (docs/executors.md, "Typed
// payloads"): the tasks of kind "resize" get their payload decoded into
// a resize; tasks of other kinds fail with ErrNoHandler, as the worker
// has no default handler.
func ExampleHandle() {
	type resize struct {
		Src   string `json:"src"`
		Width int    `json:"width"`
	}
	w, err := executor.NewWorker(executor.WorkerConfig{API: api.NewClient("http://127.0.0.1:8080", token), Queue: "img"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	executor.Handle(w, "resize", func(ctx context.Context, run *executor.Run, args resize) error {
		thumb := strings.TrimSuffix(args.Src, ".png") + "-small.png" // a real handler resizes args.Src to args.Width
		return run.SetOutput(map[string]string{"thumb": thumb})
	})
	_ = w.Run(context.Background())
}
