package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
	"github.com/taskledger/taskledger/internal/testnode"
)

// TestFollowUpsKeepToolPairs runs an LLM-shaped Turn (the model's input,
// its answer with two tool calls, the calls and their results) and stops
// the worker while the second tool is in flight. A follow-up that came
// while it ran (m0, consumed by the holder's check) and one that came
// while no executor ran (m1: a monitor's token-less checks only peek at
// it) reach the resumed run, and join its transcript only once Turn 1,
// run again, has every tool result: each tool call stays next to its
// result, as LLM APIs require.
func TestFollowUpsKeepToolPairs(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	const queue, executorID = "followups", "exec-f"
	inFlight := make(chan string, 1)
	final := make(chan []api.TranscriptItem, 1)
	handler := func(first bool) executor.Handler {
		return func(ctx context.Context, run *executor.Run) (string, error) {
			err := run.Turn(ctx, func(t *executor.Turn) error {
				for _, it := range []api.TranscriptItem{
					{Kind: api.ItemModelInput, Content: text("user: fix the flaky test")},
					{Kind: api.ItemModelOutput, Content: text(`assistant: tool_use read_log, tool_use run_tests`)},
				} {
					if _, err := t.Record(ctx, it); err != nil {
						return err
					}
				}
				for _, id := range []string{"read_log", "run_tests"} {
					_, err := t.Dispatch(ctx, api.ToolCall{ID: id, Name: id, Idempotent: true}, func(ctx context.Context) (json.RawMessage, error) {
						if first && id == "run_tests" {
							inFlight <- id
							return nil, wkBlock(ctx)
						}
						return json.RawMessage(`"ok"`), nil
					}, nil)
					if err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return "", err
			}
			err = run.Turn(ctx, func(t *executor.Turn) error {
				_, err := t.Record(ctx, api.TranscriptItem{Kind: api.ItemModelOutput, Content: text("assistant: done")})
				return err
			})
			if err != nil {
				return "", err
			}
			final <- run.State().Transcript
			return "done", nil
		}
	}
	first := e.start(t, e.httpCfg(queue, executorID), handler(true))
	task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("work")})
	wkRecv(t, "run_tests in flight", inFlight)

	// The claim holder's background check consumes m0 while the Turn runs.
	if _, err := e.client.AppendMail(ctx, task.ID, events.Message{ID: "m0", Content: text("also look at the retry path")}); err != nil {
		t.Fatal(err)
	}
	testnode.Eventually(t, "the holder consumed m0", func() bool {
		got, err := e.client.Get(ctx, task.ID)
		return err == nil && got.Mailbox.Cursor == 1
	})
	first.stop(t)
	if d, ok := e.runOf(t, task.ID); !ok || len(d.Run.PendingTools) != 1 ||
		slices.ContainsFunc(d.Run.Transcript, func(it api.TranscriptItem) bool { return it.Kind == api.ItemMailbox }) {
		t.Fatalf("Run after the stop: %+v, %v; want run_tests pending and no mail inside the Turn", d.Run, ok)
	}

	// With no executor running, a monitor's checks peek at m1: it stays
	// for the holder.
	if _, err := e.client.AppendMail(ctx, task.ID, events.Message{ID: "m1", Content: text("and keep the old API")}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ch, err := e.client.Check(ctx, task.ID, "")
		if err != nil || ch.Cursor != 1 || len(ch.Messages) != 1 || ch.Messages[0].ID != "m1" {
			t.Fatalf("monitor's check: %+v, %v; want m1 left at cursor 1", ch, err)
		}
	}

	e.start(t, e.httpCfg(queue, executorID), handler(false))
	got := wkRecv(t, "the resumed run's transcript", final)
	if err := pairs(got); err != nil {
		t.Fatalf("resumed transcript %v: %v", itemIDs(got), err)
	}
	want := []string{"t1.i1", "t1.i2", "read_log", "read_log.result", "run_tests", "run_tests.result", "t1.end", "m0", "m1", "t2.i1", "t2.end"}
	if !slices.Equal(itemIDs(got), want) {
		t.Fatalf("resumed transcript %v, want %v", itemIDs(got), want)
	}
	done := e.waitStatus(t, task.ID, "succeeded")
	if done.Mailbox.Cursor != 2 {
		t.Fatalf("mailbox %+v, want both follow-ups consumed by the holder", done.Mailbox)
	}
}

// pairs fails when a transcript item other than a tool call or result
// stands between a tool call and its result, or a call has no result:
// the pairing an LLM API requires of the transcript it is sent.
func pairs(items []api.TranscriptItem) error {
	var open []string // calls without their result yet
	for _, it := range items {
		switch it.Kind {
		case api.ItemToolCall:
			open = append(open, it.ID)
		case api.ItemToolResult:
			open = slices.DeleteFunc(open, func(id string) bool { return id+".result" == it.ID })
		default:
			if len(open) > 0 {
				return fmt.Errorf("%s %s between tool calls %v and their results", it.Kind, it.ID, open)
			}
		}
	}
	if len(open) > 0 {
		return fmt.Errorf("tool calls %s without a result", strings.Join(open, ", "))
	}
	return nil
}

func itemIDs(items []api.TranscriptItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}
