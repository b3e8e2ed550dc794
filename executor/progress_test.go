package executor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/executor"
)

// TestRunProgress runs a worker whose handler saves a phase and sends
// progress lines; a client following the task's run stream sees the
// save, each line as it is sent, and the end, in that order.
func TestRunProgress(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	following := make(chan struct{})
	e.start(t, e.httpCfg("progress", "wp"), func(ctx context.Context, run *executor.Run) (string, error) {
		if err := run.SetPhase(ctx, "thinking"); err != nil {
			return "", err
		}
		wkRecv(t, "the follower saw the save", following)
		for _, text := range []string{"tok", "en", "s"} {
			if err := run.Progress(ctx, text); err != nil {
				return "", err
			}
		}
		if err := run.Progress(ctx, strings.Repeat("x", api.MaxProgressBytes+1)); !errors.Is(err, api.ErrPayloadTooLarge) {
			return "", errors.New("an oversized line was not refused")
		}
		return "done", nil
	})
	task := e.schedule(t, api.ScheduleRequest{Queue: "progress", Message: wkText("go")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []string
	err := e.client.StreamRun(ctx, task.ID, 0, func(it api.RunStreamItem) error {
		switch {
		case it.Change != nil:
			got = append(got, "saved "+string(it.Change.Set["phase"]))
			if len(got) == 1 {
				close(following)
			}
		case it.Progress != nil:
			got = append(got, it.Progress.Text)
		case it.End != nil:
			got = append(got, "end "+it.End.Status)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{`saved "thinking"`, "tok", "en", "s", "end succeeded"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the stream sent %q, want %q", got, want)
	}
}
