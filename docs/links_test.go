package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// markdownLink matches an inline Markdown link or image: [text](target).
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinks: every relative link in README.md and docs/*.md names a file
// of the repository, and a #fragment on a Markdown file names one of its
// headings; no link leaves the repository.
func TestLinks(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join("..", "README.md"))
	checked := 0
	for _, file := range files {
		for _, target := range links(t, file) {
			checked++
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, fragment, _ := strings.Cut(target, "#")
			if filepath.IsAbs(path) || strings.Contains(path, "shared/") {
				t.Errorf("%s: link %q leaves the repository", file, target)
				continue
			}
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
			}
			abs, err := filepath.Abs(resolved)
			if err != nil {
				t.Fatal(err)
			}
			root, err := filepath.Abs("..")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(abs, root+string(filepath.Separator)) {
				t.Errorf("%s: link %q leaves the repository", file, target)
				continue
			}
			if _, err := os.Stat(resolved); err != nil {
				t.Errorf("%s: link %q: %v", file, target, err)
				continue
			}
			if fragment != "" && strings.HasSuffix(resolved, ".md") && !hasAnchor(t, resolved, fragment) {
				t.Errorf("%s: link %q: %s has no heading with that anchor", file, target, resolved)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no links found: is the test running in docs/?")
	}
}

// links returns the targets of the Markdown links of file, outside code
// blocks and code spans.
func links(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fenced := false
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range markdownLink.FindAllStringSubmatch(withoutCodeSpans(line), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// withoutCodeSpans blanks out the `code spans` of a line.
func withoutCodeSpans(line string) string {
	parts := strings.Split(line, "`")
	for i := 1; i < len(parts); i += 2 {
		parts[i] = ""
	}
	return strings.Join(parts, "`")
}

// hasAnchor reports whether the Markdown file has a heading whose
// GitHub anchor is fragment.
func hasAnchor(t *testing.T, file, fragment string) bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	fenced := false
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		if anchor(strings.TrimLeft(strings.TrimSpace(line), "#")) == fragment {
			return true
		}
	}
	return false
}

// anchor is GitHub's anchor of a heading: lower case, spaces to hyphens,
// every other character but letters, digits, - and _ dropped.
func anchor(heading string) string {
	var sb strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			sb.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

// TestAnchor: headings of these docs and their GitHub anchors.
func TestAnchor(t *testing.T) {
	t.Parallel()
	for heading, want := range map[string]string{
		"work — reference executor":   "work--reference-executor",
		"Backup, audit and recovery":  "backup-audit-and-recovery",
		"Flags of `taskledger serve`": "flags-of-taskledger-serve",
		"Ready notifications (NATS)":  "ready-notifications-nats",
		" Event types (v1)":           "event-types-v1",
	} {
		if got := anchor(heading); got != want {
			t.Errorf("anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}
