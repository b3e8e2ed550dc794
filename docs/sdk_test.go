package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestPythonMethodsListed: API.md's Python SDK section names every
// public method of taskledger.Client, and no method the client lacks.
func TestPythonMethodsListed(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../sdk/python/taskledger/client.py")
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^    def ([a-z][a-z0-9_]*)\(`).FindAllStringSubmatch(string(src), -1) {
		methods[m[1]] = true
	}
	if len(methods) == 0 {
		t.Fatal("no methods found in client.py")
	}
	doc, err := os.ReadFile("API.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "## Python SDK")
	end := strings.Index(text[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal(`API.md has no "## Python SDK" section`)
	}
	section := text[start : start+1+end]
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z][a-z0-9_]*)`").FindAllStringSubmatch(section, -1) {
		listed[m[1]] = true
	}
	for m := range methods {
		if !listed[m] {
			t.Errorf("API.md's Python SDK section does not list Client.%s", m)
		}
	}
	list := section[strings.Index(section, "one method per"):strings.Index(section, "It takes and returns")]
	for _, m := range regexp.MustCompile("`([a-z][a-z0-9_]*)`").FindAllStringSubmatch(list, -1) {
		if !methods[m[1]] {
			t.Errorf("API.md lists Client.%s, which client.py does not define", m[1])
		}
	}
}
