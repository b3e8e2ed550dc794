package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIKindAndPayload drives the real binary: schedule with --kind and
// --payload (JSON, and @file), list --kind finds exactly those tasks,
// show prints the kind and the payload, a schedule's runs carry both,
// and a bad kind or payload is refused.
func TestCLIKindAndPayload(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	run := cliAgainst(t, srv)
	file := filepath.Join(t.TempDir(), "payload.json")
	if err := os.WriteFile(file, []byte("{\n  \"src\": \"dog.png\",\n  \"width\": 32\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := strings.Fields(run(0, "schedule", "--queue", "cli-kinds", "--delay", "1h", "--kind", "resize", "--payload", `{"src": "cat.png", "width": 64}`))[1]
	b := strings.Fields(run(0, "schedule", "--queue", "cli-kinds", "--delay", "1h", "--kind", "resize", "--payload", "@"+file))[1]
	other := strings.Fields(run(0, "schedule", "--queue", "cli-kinds", "--delay", "1h", "--kind", "thumb"))[1]
	out := run(0, "list", "--kind", "resize")
	if !strings.Contains(out, a) || !strings.Contains(out, b) || strings.Contains(out, other) || strings.Count(out, "\n") != 3 {
		t.Fatalf("list --kind resize:\n%s", out)
	}
	if out := run(0, "show", b); !strings.Contains(out, "resize") || !strings.Contains(out, `{"src":"dog.png","width":32}`) {
		t.Fatalf("show lacks the kind or the payload:\n%s", out)
	}
	run(0, "schedules", "create", "cli-kind", "--every", "1h", "--paused", "--queue", "cli-kinds", "--kind", "resize", "--payload", `[1, 2]`)
	if out := run(0, "schedules", "show", "cli-kind"); !strings.Contains(out, "resize") || !strings.Contains(out, "[1,2]") {
		t.Fatalf("schedules show lacks the kind or the payload:\n%s", out)
	}
	fired := strings.Fields(run(0, "schedules", "trigger", "cli-kind"))[3]
	if out := run(0, "show", fired); !strings.Contains(out, "resize") || !strings.Contains(out, "[1,2]") {
		t.Fatalf("show of a run's task:\n%s", out)
	}
	run(2, "schedule", "--payload", "{not json")
	run(2, "schedule", "--payload", "@"+filepath.Join(t.TempDir(), "missing.json"))
	if out := run(1, "schedule", "--kind", "Resize"); !strings.Contains(out, "invalid_argument") {
		t.Fatalf("a bad kind:\n%s", out)
	}
	if out := run(1, "list", "--kind", "Resize"); !strings.Contains(out, "invalid_argument") {
		t.Fatalf("a bad kind filter:\n%s", out)
	}
}
