package bench

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Peer is another scheduler's benchmark result, measured on the same
// machine in the same sitting as a report: the median table its program
// prints (the peers' programs are not part of this repository; their
// output is, in docs/peers/).
type Peer struct {
	// Name is the heading of the peer's table, e.g. "Asynq + Redis".
	Name string `json:"name"`
	// Title is the heading line in full (trials and N).
	Title   string       `json:"title"`
	Figures []PeerFigure `json:"figures"`
}

// PeerFigure is one row of a peer's median table.
type PeerFigure struct {
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	Median float64 `json:"median"`
}

// value returns the median of the row whose metric starts with prefix.
func (p Peer) value(prefix string) (float64, bool) {
	for _, f := range p.Figures {
		if strings.HasPrefix(f.Metric, prefix) {
			return f.Median, true
		}
	}
	return 0, false
}

// ParsePeer reads a peer program's output: the first table under a
// heading "### NAME: median ..." whose rows are
// "| metric | unit | median | ... |". It fails when there is no such
// table, so a truncated or foreign file is not taken for a result.
func ParsePeer(r io.Reader) (Peer, error) {
	var p Peer
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if p.Title == "" {
			if name, _, ok := strings.Cut(strings.TrimPrefix(line, "### "), ": median"); ok && strings.HasPrefix(line, "### ") {
				p.Name, p.Title = name, strings.TrimPrefix(line, "### ")
			}
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if len(p.Figures) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			continue
		}
		metric, unit := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1])
		median, err := strconv.ParseFloat(strings.TrimSpace(cells[2]), 64)
		if err != nil {
			continue // the header and its rule
		}
		p.Figures = append(p.Figures, PeerFigure{Metric: metric, Unit: unit, Median: median})
	}
	if err := sc.Err(); err != nil {
		return Peer{}, fmt.Errorf("bench: read peer result: %w", err)
	}
	if len(p.Figures) == 0 {
		return Peer{}, fmt.Errorf("bench: no peer median table (a line \"### NAME: median ...\" and its rows)")
	}
	return p, nil
}

// sideBySide is one row of the comparison with the peers: taskledger's
// figures (the best of them is compared) and the prefix of each peer's
// metric, and the target as a multiple of one peer's figure, if any.
type sideBySide struct {
	label      string
	unit       string
	taskledger []string // figure names: HTTP, then NATS where measured
	peer       string   // metric prefix in every peer's table
	lowerWins  bool
	// target: taskledger ≥ factor × the figure of the peer named
	// targetPeer (for rates); or ≤ limit (for latencies).
	targetPeer string
	factor     float64
	limit      float64
}

// sideBySideRows are the measurements issue 30 set targets against: the
// peers' phases (a2, a4, b, c, d2) beside the bench figures that do the
// same work.
var sideBySideRows = []sideBySide{
	{label: "end to end, 1,000 workers one task at a time", unit: "tasks/s", taskledger: []string{FigDrainHTTP, FigDrainNATS},
		peer: "b end-to-end, 1000 workers", targetPeer: "Asynq", factor: 1},
	{label: "end to end, batch claims/results", unit: "tasks/s", taskledger: []string{FigDrainBatch, FigDrainNATSBatch},
		peer: "b end-to-end, 1000 workers", targetPeer: "Asynq", factor: 2},
	{label: "enqueue, 50 goroutines one at a time", unit: "tasks/s", taskledger: []string{FigEnqueueHTTP, FigEnqueueNATS},
		peer: "a2 enqueue", targetPeer: "Asynq", factor: 0.5},
	{label: "batch enqueue, 1,000 a call", unit: "tasks/s", taskledger: []string{FigEnqueueBatch},
		peer: "a4 enqueue InsertManyFast", targetPeer: "River", factor: 0.5},
	{label: "enqueue → start p50", unit: "ms", taskledger: []string{FigSchedClaimP50}, peer: "c latency p50", lowerWins: true},
	{label: "enqueue → start p99", unit: "ms", taskledger: []string{FigSchedClaimP99}, peer: "c latency p99", lowerWins: true, limit: 5},
	{label: "1,000 due at once, lateness p99", unit: "ms", taskledger: []string{FigBurstP99}, peer: "d2 burst lateness p99", lowerWins: true, limit: 100},
}

// writeSideBySide renders the comparison with rep.Peers: one row per
// sideBySideRows entry, taskledger's HTTP and NATS figures, each peer's
// median, and whether issue 30's target was met.
func writeSideBySide(p func(string, ...any), rep Report) {
	if len(rep.Peers) == 0 {
		return
	}
	p("## side by side with the peers\n\n")
	p("The peers' own benchmark programs, run on this machine in the same sitting as this report, one after another with nothing else busy; their raw output is in [peers/](peers/). Peers: as each file's heading says (N no-op jobs, the median of the trials); taskledger: the figures of the tables below (scale %g). \"enqueue → start\" is the peers' enqueue→handler start at 500/s beside taskledger's schedule→claimable; River and Asynq have no batch claim.\n\n", rep.Scale)
	for _, peer := range rep.Peers {
		p("- %s\n", peer.Title)
	}
	p("\n| measurement | unit | taskledger HTTP | taskledger NATS |")
	for _, peer := range rep.Peers {
		p(" %s |", escapeCell(peer.Name))
	}
	p(" target | met |\n|---|---|--:|--:|")
	for range rep.Peers {
		p("--:|")
	}
	p("---|---|\n")
	for _, row := range sideBySideRows {
		cells := []string{"—", "—"}
		best, have := 0.0, false
		for i, name := range row.taskledger {
			if f, ok := rep.Figure(name); ok {
				cells[i] = formatValue(f.Value)
				if !have || (row.lowerWins && f.Value < best) || (!row.lowerWins && f.Value > best) {
					best, have = f.Value, true
				}
			}
		}
		p("| %s | %s | %s | %s |", escapeCell(row.label), row.unit, cells[0], cells[1])
		var targetPeer float64
		for _, peer := range rep.Peers {
			v, ok := peer.value(row.peer)
			if !ok {
				p(" — |")
				continue
			}
			p(" %s |", formatValue(v))
			if row.targetPeer != "" && strings.HasPrefix(peer.Name, row.targetPeer) {
				targetPeer = v
			}
		}
		target, met := "", ""
		switch {
		case row.factor > 0 && targetPeer > 0:
			target = fmt.Sprintf("≥ %g× %s", row.factor, row.targetPeer)
			if have {
				met = fmt.Sprintf("%s (%.2f×)", yesNo(best >= row.factor*targetPeer), best/targetPeer)
			}
		case row.limit > 0:
			target = fmt.Sprintf("≤ %g ms", row.limit)
			if have {
				met = yesNo(best <= row.limit)
			}
		}
		p(" %s | %s |\n", target, met)
	}
	p("\n")
}

func yesNo(b bool) string { return map[bool]string{true: "yes", false: "no"}[b] }
