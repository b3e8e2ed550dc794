package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testnode"
)

// tamperedLog runs a server on a fresh data directory, writes a few tasks
// with mail, stops it cleanly (which saves the chain head) and returns the
// directory and the path of the event stream's last block file.
func tamperedLog(t *testing.T) (data, block string) {
	t.Helper()
	data = t.TempDir()
	srv, _, _ := replayStartServer(t, data, freeAddr(t))
	ctx := context.Background()
	for i := range 12 {
		task, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "tamper",
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: fmt.Sprintf("task %d", i)}}}})
		if err != nil {
			t.Fatal(err)
		}
		task = testnode.Settled(t, srv.client, task) // its ReadyPublished next in the log
		if _, err := srv.client.AppendMail(ctx, task.ID, events.Message{Content: []events.ContentPart{{Type: "text", Text: "more"}}}); err != nil {
			t.Fatal(err)
		}
	}
	replayStopServer(t, srv)
	blocks, err := filepath.Glob(filepath.Join(data, "jetstream", "$G", "streams", events.DefaultStream, "msgs", "*.blk"))
	if err != nil || len(blocks) == 0 {
		t.Fatalf("no block files (%v)", err)
	}
	return data, blocks[len(blocks)-1]
}

// verifyKinds runs replay verify --json and returns the kinds reported.
func verifyKinds(t *testing.T, data string) map[string]int {
	t.Helper()
	out, errOut, code := replayCLI(t, "replay", "verify", "--data", data, "--json")
	var report struct {
		Violations []struct {
			Kind string `json:"kind"`
		} `json:"violations"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("exit %d, %v in %q; stderr %s", code, err, out, errOut)
	}
	kinds := map[string]int{}
	for _, v := range report.Violations {
		kinds[v.Kind]++
	}
	if code != 1 || len(kinds) == 0 {
		t.Fatalf("exit %d with violations %v: a tampered log verified clean", code, kinds)
	}
	return kinds
}

// startWarning starts a server on data and returns the warning its
// /readyz shows about the log, and whether the start-up log warned.
// readyzLogField is the "log" field of the /readyz answer of the server
// at addr.
func readyzLogField(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Log string `json:"log"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Log
}

func startWarning(t *testing.T, data string) (readyzLog string, logged bool) {
	t.Helper()
	addr := freeAddr(t)
	srv, logs, _ := replayStartServer(t, data, addr)
	defer replayStopServer(t, srv)
	readyzLog = readyzLogField(t, addr)
	_, logged = replayLogLine(t, logs, "the log is damaged: events were lost or changed; run taskledger replay verify")
	return readyzLog, logged
}

// TestTamperedLogIsDetected damages a stopped server's log three ways and
// checks that replay verify reports each, and that a cut tail is also
// reported at start-up.
func TestTamperedLogIsDetected(t *testing.T) {
	t.Parallel()
	t.Run("FlippedByte", func(t *testing.T) {
		t.Parallel()
		data, block := tamperedLog(t)
		b, err := os.ReadFile(block)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0x01
		if err := os.WriteFile(block, b, 0o600); err != nil {
			t.Fatal(err)
		}
		kinds := verifyKinds(t, data)
		t.Logf("flipped byte: %v", kinds)
		// JetStream drops what fails its checksum: a hole, or the rest of
		// the block when the flip hit a record's length.
		if warning, _ := startWarning(t, data); warning == "" {
			t.Fatal("/readyz shows no damage after a flipped byte")
		}
	})
	t.Run("CutTail", func(t *testing.T) {
		t.Parallel()
		data, block := tamperedLog(t)
		info, err := os.Stat(block)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(block, info.Size()-150); err != nil {
			t.Fatal(err)
		}
		kinds := verifyKinds(t, data)
		t.Logf("cut tail: %v", kinds)
		if kinds["truncated"] == 0 {
			t.Fatalf("violations %v, want truncated", kinds)
		}
		warning, logged := startWarning(t, data)
		if !logged || !strings.Contains(warning, "ends before its saved chain head") {
			t.Fatalf("start-up logged the cut: %v; /readyz log %q", logged, warning)
		}
	})
	t.Run("DeletedEvent", func(t *testing.T) {
		t.Parallel()
		data, block := tamperedLog(t)
		// Each task is TaskScheduled (released), ReadyPublished,
		// MailboxAppended: record 4 (seq 5) is the second task's
		// ReadyPublished, which its mail links to.
		deleteRecord(t, block, 4)
		kinds := verifyKinds(t, data)
		if kinds["missing"] != 1 || kinds["broken_link"] == 0 {
			t.Fatalf("violations %v, want one missing and a broken link", kinds)
		}
		if warning, _ := startWarning(t, data); !strings.Contains(warning, "1 sequences of the log hold no event") {
			t.Fatalf("/readyz log %q, want the missing sequence", warning)
		}
	})
}

// deleteRecord cuts the n-th message record (0-based) out of a JetStream
// block file, as an editor of the file would. A record is total_len(4,
// little-endian, high bit set when it has headers), sequence(8),
// timestamp(8), subject_len(2), subject, [header_len(4), header], data,
// hash(8); total_len counts all of it.
func deleteRecord(t *testing.T, block string, n int) {
	t.Helper()
	b, err := os.ReadFile(block)
	if err != nil {
		t.Fatal(err)
	}
	off := 0
	for i := 0; ; i++ {
		if off+4 > len(b) {
			t.Fatalf("block has %d records, want more than %d", i, n)
		}
		size := int(binary.LittleEndian.Uint32(b[off:]) &^ (1 << 31))
		if i == n {
			b = append(b[:off:off], b[off+size:]...)
			break
		}
		off += size
	}
	if err := os.WriteFile(block, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
