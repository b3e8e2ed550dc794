package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/testnats"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	PollsChild() // the bench's waiting polls run in a child: this binary
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(testnats.NATSLeaks...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestBenchSmoke runs the whole benchmark at a tiny scale so its code
// cannot rot: every figure must be reported, none is held to its target
// (figures from a loaded CI machine mean nothing).
func TestBenchSmoke(t *testing.T) {
	var table, progress bytes.Buffer
	rep, err := Run(t.Context(), Config{Scale: 0.02, Dir: t.TempDir(), Progress: &progress}, &table)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	t.Logf("table:\n%s", table.String())
	if missing := rep.Missing(); len(missing) > 0 {
		t.Fatalf("report lacks %d figures: %s", len(missing), strings.Join(missing, "; "))
	}
	for _, f := range rep.Figures {
		if !strings.Contains(table.String(), f.Name) {
			t.Errorf("table lacks figure %q", f.Name)
		}
		// A heap may shrink while it is sampled (growth, and the memory
		// of a crowd of polls at this tiny scale); every other figure is
		// a rate, a duration, a size or a ratio.
		// The durability section's repeats carry a mode suffix.
		name := strings.TrimSuffix(strings.TrimSuffix(f.Name, osSuffix), fsyncSuffix)
		shrinks := name == FigOverloadGrowth || name == FigWaitingMemory || name == FigWaiterMemory || name == FigEpochLive || name == FigEpochSealed || name == FigEpochRemoved
		if math.IsNaN(f.Value) || math.IsInf(f.Value, 0) || (f.Value < 0 && !shrinks) {
			t.Errorf("figure %q = %v, want a number ≥ 0", f.Name, f.Value)
		}
	}

	t.Run("JSON", func(t *testing.T) {
		var out bytes.Buffer
		if err := json.NewEncoder(&out).Encode(rep); err != nil {
			t.Fatal(err)
		}
		var back Report
		if err := json.Unmarshal(out.Bytes(), &back); err != nil {
			t.Fatal(err)
		}
		if len(back.Figures) != len(rep.Figures) || back.Figures[0].Name != rep.Figures[0].Name || back.Figures[0].Value != rep.Figures[0].Value {
			t.Fatalf("JSON round trip changed the report: %+v", back.Figures)
		}
	})
}

// TestTableNamesGOMAXPROCS checks the table's last line: a run with
// GOMAXPROCS set apart from the CPUs says so, since it changes the
// figures (docs/performance.md, "Garbage collection on two cores").
func TestTableNamesGOMAXPROCS(t *testing.T) {
	for _, c := range []struct {
		procs int
		want  string
	}{
		{2, "(scale 1, 2 CPUs, go1.26.8, 240s)\n"},
		{4, "(scale 1, 2 CPUs, GOMAXPROCS 4, go1.26.8, 240s)\n"},
	} {
		var out bytes.Buffer
		rep := Report{Scale: 1, Seconds: 240, GoVersion: "go1.26.8", NumCPU: 2, GOMAXPROCS: c.procs}
		if err := WriteTable(&out, rep); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(out.String(), c.want) {
			t.Errorf("GOMAXPROCS %d: table ends %q, want %q", c.procs, out.String(), c.want)
		}
	}
}

// TestHoldPollsCountsErrors checks the polls' child process's report: a
// poll whose server refuses it counts a failed request, and the count is
// written when its standard input ends.
func TestHoldPollsCountsErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now: every poll is refused
	stop, stopWrite := io.Pipe()
	time.AfterFunc(200*time.Millisecond, func() { stopWrite.Close() })
	var out bytes.Buffer
	if err := holdPolls(url+" q 2", stop, &out); err != nil {
		t.Fatal(err)
	}
	var errs int
	if _, err := fmt.Sscanf(out.String(), "errors %d\n", &errs); err != nil || errs == 0 {
		t.Errorf("output %q: want errors N with N > 0", out.String())
	}
	if err := holdPolls("no-url", strings.NewReader(""), &out); err == nil {
		t.Error("holdPolls with a malformed spec: no error")
	}
}

// TestCannedDrainsDoN checks the canned server the drains' ceilings and
// floors run against: a drain of n tasks claims and reports exactly n,
// however many loops still poll when the last is done, so a floor makes
// the appends it counts and no more.
func TestCannedDrainsDoN(t *testing.T) {
	const n = 250
	for name, loops := range map[string]func(context.Context, *api.Client, string, int, *atomic.Int64) error{
		"claims/next": drainEach, "batch": drainBatches,
	} {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int64
			url, stop, err := serveCanned(n, func(context.Context) error {
				calls.Add(1)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			c := httpClient(url, drainLoops)
			defer c.HTTP.CloseIdleConnections()
			if err := rawDrain(t.Context(), c, n, loops); err != nil {
				t.Fatal(err)
			}
			if got := calls.Load(); got != 2*n { // a claim and a result a task
				t.Errorf("the server was called for %d tasks' claims and results, want %d", got, 2*n)
			}
		})
	}
}
