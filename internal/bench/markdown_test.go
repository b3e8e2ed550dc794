package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestWriteMarkdown: a report renders as the machine, the date and one
// table per section, each figure a row with its ratio, target and
// whether it was met.
func TestWriteMarkdown(t *testing.T) {
	t.Parallel()
	met, missed := true, false
	rep := Report{
		Scale: 0.02, Started: time.Date(2026, 12, 3, 15, 4, 5, 0, time.UTC), Seconds: 12.4,
		GoVersion: "go1.26.8", NumCPU: 2, GOMAXPROCS: 4,
		Machine: Machine{OS: "linux", Arch: "amd64", CPUModel: "Example CPU @ 2.0GHz", MemoryBytes: 8 << 30, NATSServer: "2.15.2"},
		Note:    "A fixture.",
		Figures: []Figure{
			{Section: "ceiling", Name: FigAsync, Value: 169074, Unit: "msgs/s"},
			{Section: "ceiling", Name: FigClaim, Value: 43709, Unit: "claims/s", Ratio: 0.86, RatioOf: ratioSync16},
			{Section: "timers", Name: FigReleaseP99, Value: 12.04, Unit: "ms", Ratio: 261, RatioOf: ratioRTT, Target: "≤ 5 ms", Met: &missed},
			{Section: "timers", Name: FigReleaseEarly, Value: 0, Unit: "tasks", Target: "0", Met: &met},
			{Section: "sync-always", Name: "a | b", Value: 3.5, Unit: "×"},
		},
	}
	var out bytes.Buffer
	if err := WriteMarkdown(&out, rep); err != nil {
		t.Fatal(err)
	}
	md := out.String()
	for _, want := range []string{
		"# Benchmarks\n",
		"Measured on 2026-12-03, scale 0.02, 12 s.\n\nA fixture.\n",
		"| CPU model | Example CPU @ 2.0GHz |\n| CPUs | 2 (GOMAXPROCS 4) |\n| memory | 8.0 GiB |\n| OS | linux/amd64 |\n| Go | go1.26.8 |\n| nats-server (embedded) | 2.15.2 |\n",
		"## ceiling\n\n| figure | value | unit | vs reference | target | met |\n|---|--:|---|---|---|---|\n| raw async append (≤ 4096 in flight) | 169074 | msgs/s |  |  |  |\n| claim decide+append, 16 goroutines | 43709 | claims/s | 0.86× raw sync 16 |  |  |\n\n## timers\n",
		"| release lateness p99 | 12.0 | ms | 261× sync append RTT | ≤ 5 ms | no |\n",
		"| releases before runAt | 0.00 | tasks |  | 0 | yes |\n\n## sync-always\n",
		`| a \| b | 3.50 | × |`,
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Count(md, "## ") != 3 || !strings.HasSuffix(md, "|  |  |  |\n\n") {
		t.Errorf("want three sections and a blank line at the end:\n%s", md)
	}
}

// TestMarkdownNotRecorded: what a report lacks of the machine reads "not
// recorded", never an empty or invented value.
func TestMarkdownNotRecorded(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := WriteMarkdown(&out, Report{Scale: 1, NumCPU: 2, GOMAXPROCS: 2}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| CPU model | not recorded |", "| CPUs | 2 |", "| memory | not recorded |", "| OS | not recorded |", "| Go | not recorded |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, out.String())
		}
	}
}

// TestThisMachine: a run records the OS, architecture and nats-server
// version, and on Linux the CPU model and memory.
func TestThisMachine(t *testing.T) {
	t.Parallel()
	m := thisMachine()
	if m.OS != runtime.GOOS || m.Arch != runtime.GOARCH || m.NATSServer == "" {
		t.Fatalf("machine %+v", m)
	}
	if runtime.GOOS == "linux" && (m.MemoryBytes == 0 || m.CPUModel == "") {
		t.Errorf("on Linux the CPU model and memory come from /proc: %+v", m)
	}
}

// TestBenchmarksDocIsGenerated: docs/benchmarks.md is exactly what the
// renderer makes of docs/benchmarks.json, so the page is never edited
// apart from its report (make bench-doc regenerates both).
func TestBenchmarksDocIsGenerated(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/benchmarks.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if missing := rep.Missing(); len(missing) > 0 {
		t.Errorf("docs/benchmarks.json lacks figures %q", missing)
	}
	var want bytes.Buffer
	if err := WriteMarkdown(&want, rep); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("docs/benchmarks.md is not the rendering of docs/benchmarks.json: run go run ./cmd/taskledger bench --markdown docs/benchmarks.json > docs/benchmarks.md")
	}
}

// asynqOutput is the shape of a peer program's output: trial lines, the
// median table ParsePeer reads, then a pooled table it must not read.
const asynqOutput = `# Asynq + Redis
--- trial 1 ---
a2 enqueue one-at-a-time, 50 goroutines: 2000 jobs in 33ms = 59923 jobs/s

### Asynq + Redis: median and min–max of 3 trials (N=20000)

| metric | unit | median | min–max | trials |
|---|---|---|---|---|
| a2 enqueue one-at-a-time (50 goroutines) | jobs/s | 60000 | 59923–61000 | 59923 |
| b end-to-end, 1000 workers | jobs/s | 10000 | 9000–11000 | 10000 |
| c latency p99 | ms | 1380 | 1380–1380 | 1380 |
| d2 burst lateness p99 | ms | 4981 | 4981–4981 | 4981 |

Pooled over all trials (every job of every trial):

| samples | n | min ms | p50 ms | p99 ms | max ms |
|---|---|---|---|---|---|
| c latency | 2000 | 0.74 | 608 | 1380 | 1417 |
`

// TestSideBySide: a peer's median table is read (and nothing after it),
// and the comparison sets taskledger's best figure beside it with the
// target's verdict; a file without the table is refused.
func TestSideBySide(t *testing.T) {
	t.Parallel()
	peer, err := ParsePeer(strings.NewReader(asynqOutput))
	if err != nil {
		t.Fatal(err)
	}
	if peer.Name != "Asynq + Redis" || len(peer.Figures) != 4 || peer.Figures[1].Median != 10000 {
		t.Fatalf("parsed %+v", peer)
	}
	if _, err := ParsePeer(strings.NewReader("a2 enqueue: 5 jobs/s\n| x | y | 3 |\n")); err == nil {
		t.Fatal("a file without a median table parsed")
	}
	rep := Report{Scale: 1, NumCPU: 2, GOMAXPROCS: 2, Peers: []Peer{peer}, Figures: []Figure{
		{Section: "http", Name: FigDrainHTTP, Value: 6000, Unit: "tasks/s"},
		{Section: "nats", Name: FigDrainNATS, Value: 12000, Unit: "tasks/s"},
		{Section: "http", Name: FigEnqueueHTTP, Value: 20000, Unit: "tasks/s"},
		{Section: "latency", Name: FigSchedClaimP99, Value: 0.9, Unit: "ms"},
		{Section: "timers", Name: FigBurstP99, Value: 259, Unit: "ms"},
	}}
	var out bytes.Buffer
	if err := WriteMarkdown(&out, rep); err != nil {
		t.Fatal(err)
	}
	md := out.String()
	for _, want := range []string{
		"## side by side with the peers\n",
		"| measurement | unit | taskledger HTTP | taskledger NATS | Asynq + Redis | target | met |\n",
		"| end to end, 1,000 workers one task at a time | tasks/s | 6000 | 12000 | 10000 | ≥ 1× Asynq | yes (1.20×) |\n",
		"| end to end, batch claims/results | tasks/s | — | — | 10000 | ≥ 2× Asynq |  |\n",
		"| enqueue, 50 goroutines one at a time | tasks/s | 20000 | — | 60000 | ≥ 0.5× Asynq | no (0.33×) |\n",
		"| enqueue → start p99 | ms | 0.90 | — | 1380 | ≤ 5 ms | yes |\n",
		"| 1,000 due at once, lateness p99 | ms | 259 | — | 4981 | ≤ 100 ms | no |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
