package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchMarkdown: bench --markdown renders a --json report without
// measuring anything, and refuses a file that is not one.
func TestBenchMarkdown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	report := filepath.Join(dir, "bench.json")
	if err := os.WriteFile(report, []byte(`{"scale":1,"started":"2026-12-03T10:00:00Z","seconds":227,"goVersion":"go1.26.8","numCPU":2,"gomaxprocs":2,
		"machine":{"os":"linux","arch":"amd64","cpuModel":"Example CPU","memoryBytes":8589934592,"natsServer":"2.15.2"},
		"figures":[{"section":"ceiling","name":"raw async append (≤ 4096 in flight)","value":169074,"unit":"msgs/s"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := benchCommand(t.Context(), []string{"--markdown", report}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Benchmarks\n", "Measured on 2026-12-03", "| CPU model | Example CPU |", "## ceiling\n", "| raw async append (≤ 4096 in flight) | 169074 | msgs/s |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := benchCommand(t.Context(), []string{"--markdown", bad}, &out); err == nil {
		t.Error("a file that is no report rendered")
	}
	if err := benchCommand(t.Context(), []string{"--markdown", filepath.Join(dir, "missing.json")}, &out); err == nil {
		t.Error("a missing file rendered")
	}
}
