package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/chainkey"
)

// dataJS opens the data directory of a stopped server with an embedded
// server of its own; stop stops it, giving the directory back.
func dataJS(t *testing.T, data string) (js jetstream.JetStream, stop func()) {
	t.Helper()
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := srv.Connect()
	if err != nil {
		srv.Shutdown()
		t.Fatal(err)
	}
	stop = func() { nc.Close(); srv.Shutdown() }
	if js, err = jetstream.New(nc); err != nil {
		stop()
		t.Fatal(err)
	}
	return js, stop
}

// sealLog seals the event stream of the log in the data directory of a
// stopped server, as the operator's seal of an epoch will.
func sealLog(t *testing.T, data string) {
	t.Helper()
	js, closeJS := dataJS(t, data)
	defer closeJS()
	ctx := context.Background()
	s, err := js.Stream(ctx, events.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Sealed = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// TestArchiveCommands archives the log a stopped server left and reads
// the archive with the offline tools: archive (refused before the seal),
// archive verify (with --live), history, show and replay verify, each
// answering from the archive as from the log.
func TestArchiveCommands(t *testing.T) {
	t.Parallel()
	data, addr := t.TempDir(), freeAddr(t)
	srv := startServer(t, data, addr)
	roots := replayTraffic(t, srv.client)
	replayStopServer(t, srv)
	dir := filepath.Join(t.TempDir(), "epoch-0")

	_, errOut, code := replayCLI(t, "archive", "0", "--to", dir, "--data", data)
	if code != 1 || !strings.Contains(errOut, "not sealed") {
		t.Fatalf("archive of an unsealed log: exit %d, stderr:\n%s", code, errOut)
	}
	sealLog(t, data)
	_, errOut, code = replayCLI(t, "archive", "1", "--to", dir, "--data", data)
	if code != 1 || !strings.Contains(errOut, "only epoch 0") {
		t.Fatalf("archive of an unknown epoch: exit %d, stderr:\n%s", code, errOut)
	}
	out, errOut, code := replayCLI(t, "archive", "0", "--to", dir, "--data", data)
	summary := regexp.MustCompile(`^archived epoch 0 of TASKLEDGER: 1 parts, (\d+) events to ` + regexp.QuoteMeta(dir) + "\n").FindStringSubmatch(out)
	if code != 0 || summary == nil || !strings.Contains(errOut, "archive:") {
		t.Fatalf("archive: exit %d, output %q\nstderr:\n%s", code, out, errOut)
	}

	// Every file of the archive, runs.ndjson included, is the operator's
	// alone: it holds every tenant's events.
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) < 3 {
		t.Fatalf("archive directory: %v %v", entries, err)
	}
	for _, e := range entries {
		if info, err := e.Info(); err != nil || info.Mode().Perm() != 0o600 {
			t.Fatalf("archive file %s: %v %v, want mode 0600", e.Name(), info.Mode(), err)
		}
	}

	out, errOut, code = replayCLI(t, "archive", "verify", dir, "--live", "--data", data)
	if code != 0 || !strings.Contains(out, ", "+summary[1]+" events: verified\n") || !strings.Contains(out, "hold exactly the archive's events") {
		t.Fatalf("archive verify --live: exit %d, output %q\nstderr:\n%s", code, out, errOut)
	}

	same := func(archived, live []string) {
		t.Helper()
		got, errOut, code := replayCLI(t, archived...)
		if code != 0 {
			t.Fatalf("%v: exit %d\nstderr:\n%s", archived, code, errOut)
		}
		want, _, _ := replayCLI(t, live...)
		if got != want || got == "" {
			t.Fatalf("%v printed\n%s\n%v printed\n%s", archived, got, live, want)
		}
	}
	same([]string{"history", roots[1], "--archive", dir, "--ndjson"}, []string{"history", roots[1], "--offline", "--data", data, "--ndjson"})
	same([]string{"history", roots[0], "--tree", "--archive", dir}, []string{"history", roots[0], "--tree", "--offline", "--data", data})
	key := filepath.Join(data, chainkey.FileName) // the archived events are keyed: verifying them takes the log's key
	same([]string{"replay", "verify", "--archive", dir, "--chain-key-file", key}, []string{"replay", "verify", "--data", data})
	same([]string{"replay", "verify", "--archive", dir, "--chain-key-file", key, "--json"}, []string{"replay", "verify", "--data", data, "--json"})

	out, _, code = replayCLI(t, "show", roots[0], "--archive", dir)
	if code != 0 || !regexp.MustCompile(`(?m)^status +succeeded$`).MatchString(out) || !strings.Contains(out, roots[0]) {
		t.Fatalf("show --archive: exit %d\n%s", code, out)
	}
	out, _, code = replayCLI(t, "show", roots[2], "--archive", dir, "--json")
	var task struct{ ID, Status string }
	if err := json.Unmarshal([]byte(out), &task); err != nil || code != 0 || task.ID != roots[2] || task.Status != "canceled" {
		t.Fatalf("show --archive --json: exit %d, %+v (%v)", code, task, err)
	}
	_, errOut, code = replayCLI(t, "history", "NOSUCHTASK", "--archive", dir)
	if code != 1 || !strings.Contains(errOut, "not in the archive") {
		t.Fatalf("history of an unknown task: exit %d, %q", code, errOut)
	}

	_, errOut, code = replayCLI(t, "archive", "0", "--to", dir, "--data", data)
	if code != 1 || !strings.Contains(errOut, "not empty") {
		t.Fatalf("archive over an archive: exit %d, stderr:\n%s", code, errOut)
	}
	part := filepath.Join(dir, "part-0.tlar")
	b, err := os.ReadFile(part)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(part, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = replayCLI(t, "archive", "verify", dir)
	if code != 1 || !strings.Contains(errOut, "the archive is damaged: part 0") {
		t.Fatalf("archive verify of a damaged archive: exit %d, stderr:\n%s", code, errOut)
	}
	_, errOut, code = replayCLI(t, "replay", "verify", "--archive", dir)
	if code != 1 || !strings.Contains(errOut, "the archive is damaged") {
		t.Fatalf("replay verify of a damaged archive: exit %d, stderr:\n%s", code, errOut)
	}
}
