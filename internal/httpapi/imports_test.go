package httpapi_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestEdgeLinksOnlyTheService: the HTTP edge's build (its tests aside)
// links nothing the service keeps behind it: not the scheduler's
// implementation, the log, the projections, the reactors, replay or the
// executor SDK (DESIGN, "The HTTP edge"). depguard checks the edge's own
// imports; this checks everything they pull in.
func TestEdgeLinksOnlyTheService(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const mod = "github.com/taskledger/taskledger/"
	banned := []string{"internal/scheduler", "internal/store", "internal/eventlog", "projections", "reactors", "replay", "executor"}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if dep == mod+b || strings.HasPrefix(dep, mod+b+"/") {
				t.Errorf("internal/httpapi links %s", dep)
			}
		}
	}
}
