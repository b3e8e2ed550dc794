package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/taskledger/taskledger/internal/bench"
)

// benchCommand measures this machine: throughput, latency, timer
// lateness, replay and memory, each next to the raw JetStream ceiling of
// the same run, on a fresh embedded server (internal/bench.Run).
func benchCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("bench")
	scale := fs.Float64("scale", 0, "multiply the work by this (default 1, or BENCH_SCALE); 1 takes a few minutes on 2 cores")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	dir := fs.String("dir", "", "put the servers' files in a fresh directory under this one (default the system temp directory)")
	profiles := fs.String("profile", "", "write one CPU profile per section (lifecycle.pprof, ...) into this directory")
	only := fs.String("only", "", "run only these comma-separated sections after the ceiling: "+strings.Join(bench.Sections, ","))
	markdown := fs.String("markdown", "", "measure nothing: print the report in this file (the output of --json) as the Markdown of docs/benchmarks.md")
	peerFiles := fs.String("peers", "", "comma-separated files, each a peer benchmark's output (its \"### NAME: median\" table), measured in the same sitting: the report carries them and the Markdown sets them beside taskledger's figures")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: bench takes no arguments", errUsage)
	}
	peers, err := readPeers(*peerFiles)
	if err != nil {
		return err
	}
	if *markdown != "" {
		return renderMarkdown(*markdown, peers, stdout)
	}
	if *scale == 0 {
		if v, ok := os.LookupEnv("BENCH_SCALE"); ok && v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0) {
				return fmt.Errorf("%w: BENCH_SCALE=%q: want a positive number", errUsage, v)
			}
			*scale = f
		}
	}
	if !(*scale >= 0) || math.IsInf(*scale, 0) {
		return fmt.Errorf("%w: --scale %v: want a positive number", errUsage, *scale)
	}
	cfg := bench.Config{Scale: *scale, JSON: *asJSON, Dir: *dir, ProfileDir: *profiles, Progress: os.Stderr, Peers: peers}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	_, err = bench.Run(ctx, cfg, stdout)
	return err
}

// readPeers parses each comma-separated file as a peer's benchmark
// output (bench.ParsePeer).
func readPeers(list string) ([]bench.Peer, error) {
	var peers []bench.Peer
	for _, path := range strings.Split(list, ",") {
		if path == "" {
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("%w: --peers: %w", errUsage, err)
		}
		p, err := bench.ParsePeer(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%w: --peers %s: %w", errUsage, path, err)
		}
		peers = append(peers, p)
	}
	return peers, nil
}

// renderMarkdown prints the bench report in the JSON file path as
// Markdown (bench.WriteMarkdown); peers, if given, replace the report's.
func renderMarkdown(path string, peers []bench.Peer, stdout io.Writer) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("bench --markdown: %w", err)
	}
	var rep bench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("bench --markdown: %s: %w", path, err)
	}
	if len(peers) > 0 {
		rep.Peers = peers
	}
	return bench.WriteMarkdown(stdout, rep)
}
