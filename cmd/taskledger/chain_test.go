package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/internal/testnode"
)

// keyedLog runs a server on a fresh data directory (which makes its
// chain key), schedules a few tasks, stops it cleanly (the chain head is
// saved) and returns the directory and the tasks.
func keyedLog(t *testing.T) (data string, tasks []api.Task) {
	t.Helper()
	data = t.TempDir()
	srv, _, _ := replayStartServer(t, data, freeAddr(t))
	ctx := context.Background()
	for i := range 3 {
		task, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "chain",
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: fmt.Sprintf("task %d", i)}}}})
		if err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, testnode.Settled(t, srv.client, task))
	}
	replayStopServer(t, srv)
	info, err := os.Stat(filepath.Join(data, chainkey.FileName))
	if err != nil {
		t.Fatalf("serve made no chain key: %v", err)
	}
	if perm := info.Mode().Perm(); perm != 0o600 {
		t.Fatalf("chain key mode %04o, want 0600", perm)
	}
	return data, tasks
}

// withLog opens the stopped server's log as a process with write access
// to its stream (and no key) would, and calls fn with it.
func withLog(t *testing.T, data string, fn func(js jetstream.JetStream, s jetstream.Stream)) {
	t.Helper()
	nf := natsFlags{data: data, stream: events.DefaultStream}
	nc, _, closeNATS, err := nf.connect(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer closeNATS()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), events.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	fn(js, s)
}

// forge appends to task's subject the next event, a Canceled with the
// right number and the right unkeyed hash link, encoded by encode, and
// returns its sequence.
func forge(t *testing.T, data string, task api.Task, encode func(events.Event) ([]byte, error)) (seq uint64) {
	t.Helper()
	ctx := context.Background()
	subject := events.DefaultSubjects.Event(task.CustomerID, task.ID)
	withLog(t, data, func(js jetstream.JetStream, s jetstream.Stream) {
		last, err := s.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			t.Fatal(err)
		}
		prev, err := events.Decode(last.Data)
		if err != nil {
			t.Fatal(err)
		}
		b, err := encode(events.Event{ID: events.NewID(), TaskID: task.ID, CustomerID: task.CustomerID, Number: prev.Number + 1,
			At: time.Now(), Actor: "scheduler", Prev: events.HashOf(last.Data), Data: events.Canceled{Reason: "forged"}})
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, subject, b, jetstream.WithExpectLastSequencePerSubject(last.Sequence))
		if err != nil {
			t.Fatal(err)
		}
		seq = ack.Sequence
	})
	return seq
}

// verifyReport runs replay verify --json with args and returns its exit
// code and report.
func verifyReport(t *testing.T, args ...string) (int, []struct {
	Seq    uint64 `json:"seq"`
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}) {
	t.Helper()
	out, errOut, code := replayCLI(t, append([]string{"replay", "verify", "--json"}, args...)...)
	var report struct {
		Violations []struct {
			Seq    uint64 `json:"seq"`
			Kind   string `json:"kind"`
			Detail string `json:"detail"`
		} `json:"violations"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("exit %d, %v in %q; stderr %s", code, err, out, errOut)
	}
	return code, report.Violations
}

// readyzLog starts a server on data, returns the warning its /readyz
// shows about the log and the server's log so far, and, with schedule,
// schedules a task before it stops the server (so the chain head saved at
// its shutdown is past every earlier event).
func readyzLog(t *testing.T, data string, schedule bool) (warning, logs string) {
	t.Helper()
	addr := freeAddr(t)
	srv, buf, _ := replayStartServer(t, data, addr)
	defer replayStopServer(t, srv)
	if schedule {
		task, _, err := srv.client.Schedule(context.Background(), api.ScheduleRequest{Queue: "chain",
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "after the forgery"}}}})
		if err != nil {
			t.Fatal(err)
		}
		testnode.Settled(t, srv.client, task)
	}
	return readyzLogField(t, addr), buf.String()
}

// TestForgedEventIsDetected appends to a keyed log, with the server
// down, the event someone with write access to the stream but not the
// chain key would: the right number and the right SHA-256 link, unkeyed
// (a downgrade to the old link) or signed with a key of their own. replay
// verify reports it at its sequence, and the next start warns on /readyz
// and in its log; a start after the chain head moved past it still does.
func TestForgedEventIsDetected(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		encode func(events.Event) ([]byte, error)
		kind   string
	}{
		{"UnkeyedLink", events.Encode, "unkeyed"},
		{"AnotherKey", func(ev events.Event) ([]byte, error) {
			kr, err := events.NewKeyring(events.ChainKey{ID: 1, Secret: bytes.Repeat([]byte("k"), events.MinChainKeyBytes)})
			if err != nil {
				return nil, err
			}
			return kr.AppendEncode(nil, ev)
		}, "bad_mac"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			data, tasks := keyedLog(t)
			if code, got := verifyReport(t, "--data", data); code != 0 || len(got) != 0 {
				t.Fatalf("the untouched keyed log: exit %d, %v", code, got)
			}
			seq := forge(t, data, tasks[1], tt.encode)
			code, got := verifyReport(t, "--data", data)
			if code != 1 || len(got) != 1 || got[0].Kind != tt.kind || got[0].Seq != seq {
				t.Fatalf("exit %d, violations %+v: want one %s at sequence %d", code, got, tt.kind, seq)
			}
			// The start after the forgery, which writes more events, so
			// the chain head saved at its shutdown is past it, and the
			// start after that.
			for i := range 2 {
				warning, logs := readyzLog(t, data, i == 0)
				if !strings.Contains(warning, "not vouched for by its chain key") || !strings.Contains(warning, fmt.Sprintf("sequence %d,", seq)) {
					t.Fatalf("/readyz log %q, want the forged event at %d\nserver log:\n%s", warning, seq, logs)
				}
			}
		})
	}
}

// TestChainKeyRotation rotates a log's key: the new key signs what the
// next start writes, and both verify together; a key file without the old
// key names it.
func TestChainKeyRotation(t *testing.T) {
	t.Parallel()
	data, tasks := keyedLog(t)
	out, errOut, code := replayCLI(t, "chain-key", "rotate", "--data", data)
	if code != 0 || !strings.Contains(out, "added chain key 2") {
		t.Fatalf("chain-key rotate: exit %d\n%s\n%s", code, out, errOut)
	}
	srv, _, _ := replayStartServer(t, data, freeAddr(t))
	task, _, err := srv.client.Schedule(context.Background(), api.ScheduleRequest{Queue: "chain",
		Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "after rotation"}}}})
	if err != nil {
		t.Fatal(err)
	}
	task = testnode.Settled(t, srv.client, task)
	replayStopServer(t, srv)
	keyOf := func(task api.Task) (key uint32) {
		withLog(t, data, func(_ jetstream.JetStream, s jetstream.Stream) {
			m, err := s.GetLastMsgForSubject(context.Background(), events.DefaultSubjects.Event(task.CustomerID, task.ID))
			if err != nil {
				t.Fatal(err)
			}
			ev, err := events.Decode(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			key = ev.Key
		})
		return key
	}
	if old, rotated := keyOf(tasks[0]), keyOf(task); old != 1 || rotated != 2 {
		t.Fatalf("signed with keys %d and %d, want 1 before the rotation and 2 after", old, rotated)
	}
	if code, got := verifyReport(t, "--data", data); code != 0 || len(got) != 0 {
		t.Fatalf("a log of two keys, the file holding both: exit %d, %v", code, got)
	}
	// A key file without the old key.
	f, err := chainkey.Load(filepath.Join(data, chainkey.FileName))
	if err != nil {
		t.Fatal(err)
	}
	f.Keys = f.Keys[1:]
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	newOnly := filepath.Join(t.TempDir(), "new-only.key")
	if err := os.WriteFile(newOnly, b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, got := verifyReport(t, "--data", data, "--chain-key-file", newOnly)
	if code != 1 || len(got) != 1 || got[0].Kind != "unknown_key" || !strings.Contains(got[0].Detail, "chain key 1") {
		t.Fatalf("without the old key: exit %d, %+v; want one unknown_key naming key 1", code, got)
	}
}

// TestChainKeyMissing moves a keyed log's key file away: serve refuses
// to start and says why, replay verify says it has no key, and both work
// again with --chain-key-file naming the moved file.
func TestChainKeyMissing(t *testing.T) {
	t.Parallel()
	data, _ := keyedLog(t)
	moved := filepath.Join(t.TempDir(), "elsewhere.key")
	if err := os.Rename(filepath.Join(data, chainkey.FileName), moved); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, taskledgerBinary(t), "serve", "--data", data, "--http", freeAddr(t), "--log-format", "json").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "chain key file is missing") || !strings.Contains(string(out), "--chain-key-file") {
		t.Fatalf("serve without the key file of a keyed log: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(data, chainkey.FileName)); err == nil {
		t.Fatal("serve made a new key for a keyed log")
	}
	code, got := verifyReport(t, "--data", data)
	if code != 1 || len(got) != 1 || got[0].Kind != "unknown_key" || !strings.Contains(got[0].Detail, "--chain-key-file") {
		t.Fatalf("verify without the key file: exit %d, %+v", code, got)
	}
	if code, got := verifyReport(t, "--data", data, "--chain-key-file", moved); code != 0 || len(got) != 0 {
		t.Fatalf("verify with the moved key file: exit %d, %+v", code, got)
	}
}
