package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/replay"
)

// After RestartJetStream on a full disk, nats-server 2.15.2 sometimes
// leaves a file store's state flusher (and its clock) running past
// Shutdown — seen in about one run in four on a loaded machine. It is
// the server's, not ours: everything else must end. The package's shared
// server runs the tests that need no disk of their own (TestEpochs).
func TestMain(m *testing.M) {
	testnats.Main(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"))
}

// fullDisk is a JetStream data directory that can be filled and freed:
// a small tmpfs (a real ENOSPC), or a JetStream storage limit.
type fullDisk struct {
	dir      string
	tmpfs    bool
	maxStore int64 // the limit, without tmpfs
}

const (
	tmpfsSize = 8 << 20
	limitSize = 256 << 10
)

// limitDisk is a directory whose JetStream may store limitSize bytes.
func limitDisk(t *testing.T) *fullDisk {
	return &fullDisk{dir: t.TempDir(), maxStore: limitSize}
}

// tmpfsDisk mounts a small tmpfs, which needs root with CAP_SYS_ADMIN
// (CI runs as root, but a container may lack the capability); ok is
// false when the mount is refused.
func tmpfsDisk(t *testing.T) (d *fullDisk, ok bool) {
	dir := t.TempDir()
	if err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", tmpfsSize), "tmpfs", dir).Run(); err != nil {
		t.Logf("no tmpfs here (%v): only the storage limit reproduces the full disk", err)
		return nil, false
	}
	t.Cleanup(func() {
		// Detached: the files are gone once the server has closed them.
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return &fullDisk{dir: dir, tmpfs: true}, true
}

// fill leaves about room bytes free: a filler file takes the rest.
func (d *fullDisk) fill(t *testing.T, room int64) {
	t.Helper()
	if !d.tmpfs {
		return // the storage limit is the room
	}
	f, err := os.Create(filepath.Join(d.dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(max(size-room, 0)); err != nil {
		t.Fatal(err)
	}
}

// free gives the space back: the filler goes, or the account's limit is
// raised (as an operator would).
func (d *fullDisk) free(t *testing.T, srv *broker.Embedded) {
	t.Helper()
	if d.tmpfs {
		if err := os.Remove(filepath.Join(d.dir, "filler")); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := srv.SetMaxStore(64 << 20); err != nil {
		t.Fatal(err)
	}
}

// TestFullDiskFailsFastAndRecovers fills the disk under a running node:
// writes must answer 503 within the write timeout, /readyz must say 503
// with the reason, and once space returns writes succeed again without a
// restart, with every acknowledged task still in a log that verifies. A
// JetStream storage limit stands for the full disk everywhere; where a
// tmpfs can be mounted, a real ENOSPC is tried too.
func TestFullDiskFailsFastAndRecovers(t *testing.T) {
	t.Run("StorageLimit", func(t *testing.T) { fullDiskRecovers(t, limitDisk(t)) })
	if disk, ok := tmpfsDisk(t); ok {
		t.Run("Tmpfs", func(t *testing.T) { fullDiskRecovers(t, disk) })
	}
}

func fullDiskRecovers(t *testing.T, disk *fullDisk) {
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: disk.dir, MaxStore: disk.maxStore})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const writeTimeout = time.Second
	ctx := context.Background()
	n, err := node.New(ctx, node.Config{
		NC: nc, NoSnapshots: true, WriteTimeout: writeTimeout, StorageRetry: 100 * time.Millisecond,
		StorageError: srv.StorageError, RecoverStorage: srv.RestartJetStream, Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("node: %v", err)
		}
	}()
	hs := httptest.NewServer(n.Handler)
	defer hs.Close()
	// A hang fails the test: every answer must come within the write
	// timeout and its retries, far inside this client's limit.
	client := api.NewClient(hs.URL, "")
	client.HTTP = &http.Client{Timeout: 10 * writeTimeout}
	defer client.HTTP.CloseIdleConnections()
	<-n.Engine.Ready()

	disk.fill(t, 256<<10)
	var acked []string
	schedule := func(i int) error {
		task, _, err := client.Schedule(ctx, api.ScheduleRequest{Queue: "disk", RequestID: fmt.Sprintf("r%d", i),
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: fmt.Sprintf("task %d fills the disk", i)}}}})
		if err == nil {
			acked = append(acked, task.ID)
		}
		return err
	}
	i := 0
	for ; ; i++ {
		if i == 20000 {
			t.Fatalf("%d tasks written and the disk is still not full", i)
		}
		err := schedule(i)
		if err == nil {
			continue
		}
		if !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("write %d on a full disk: %v, want 503 unavailable", i, err)
		}
		break
	}
	t.Logf("disk full after %d acknowledged writes", len(acked))
	disk.fill(t, 0) // no room left even for a probe
	// The slack of a block file's last page may take a few more small
	// writes (a JetStream restart clears the stream's kept error).
	for n := 0; schedule(i) == nil; n++ {
		if n == 100 {
			t.Fatal("100 more writes acknowledged on a full disk")
		}
		i++
	}
	i++
	// Still failing, still answering: three refusals in a row within ten
	// tries. The health watch's JetStream restart clears the stream's kept
	// error, and a task's small TaskScheduled may then fit in a page's
	// slack (its notification's ReadyPublished does not; the schedule
	// call answers 201 scheduled and the alarm retries the publish).
	for try, fails := 0, 0; fails < 3; try++ {
		if try == 10 {
			t.Fatal("no three refusals in a row in ten writes on a full disk")
		}
		switch err := schedule(i); {
		case err == nil:
			fails = 0
		case errors.Is(err, api.ErrUnavailable):
			fails++
		default:
			t.Fatalf("write on a full disk: %v, want 503 unavailable", err)
		}
		i++
	}
	status, body := readyz(t, hs.URL)
	if status != http.StatusServiceUnavailable || body["storage"] == nil {
		t.Fatalf("/readyz %d %v while writes fail, want 503 with the storage reason", status, body)
	}

	disk.free(t, srv)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if status, _ := readyz(t, hs.URL); status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			status, body := readyz(t, hs.URL)
			t.Fatalf("/readyz %d %v a minute after space returned", status, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		// The first writes after a JetStream restart may still meet a
		// stream that is being reopened: retry as a client would, within
		// the deadline.
		if err := schedule(i); err == nil {
			break
		} else if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("write after space returned: %v", err)
		}
		i++
	}

	for _, id := range acked {
		if _, err := client.Get(ctx, id); err != nil {
			t.Fatalf("acknowledged task %s: %v", id, err)
		}
	}
	v := replay.NewVerifier(events.DefaultSubjects)
	err = n.Store.Log().Read(ctx, eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	})
	if report := v.Report(); err != nil || !report.Clean() {
		t.Fatalf("log after the full disk: %v %+v", err, report.Violations)
	}
}

func readyz(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}
