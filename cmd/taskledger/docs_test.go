package main

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestOperationsListsServeFlags: docs/operations.md's table of serve's
// flags holds every flag `taskledger serve -h` prints, and no other, each
// with the default the code has.
func TestOperationsListsServeFlags(t *testing.T) {
	t.Parallel()
	out, _ := exec.Command(taskledgerBinary(t), "serve", "-h").CombinedOutput() // -h exits 2 after the usage
	code := map[string]string{}                                                 // flag → default as -h prints it ("" for the zero value)
	usage := regexp.MustCompile(`(?m)^  -([a-z-]+)(?: [a-z0-9]+)?\n\s+(.*)$`)
	for _, m := range usage.FindAllStringSubmatch(string(out), -1) {
		def := ""
		if d := regexp.MustCompile(`\(default (.*)\)$`).FindStringSubmatch(m[2]); d != nil {
			def = strings.Trim(d[1], `"`)
		}
		code[m[1]] = def
	}
	if len(code) < 40 {
		t.Fatalf("found %d flags in serve -h:\n%s", len(code), out)
	}
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "\n### serve\n")
	if start < 0 {
		t.Fatal(`docs/operations.md has no "### serve" section`)
	}
	section := text[start:]
	section = section[:strings.Index(section[1:], "\n#")+1]
	documented := map[string]bool{}
	row := regexp.MustCompile("(?m)^\\| ((?:`--[a-z-]+`(?:, )?)+) \\|([^|]*)\\|")
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		docDefault := strings.Trim(strings.TrimSpace(m[2]), "`")
		for _, f := range regexp.MustCompile("--([a-z-]+)").FindAllStringSubmatch(m[1], -1) {
			name := f[1]
			documented[name] = true
			def, ok := code[name]
			if !ok {
				t.Errorf("docs/operations.md documents --%s, which serve does not have", name)
				continue
			}
			if !sameDefault(name, docDefault, def) {
				t.Errorf("--%s: docs/operations.md says default %q, serve -h %q", name, docDefault, def)
			}
		}
	}
	for name := range code {
		if !documented[name] {
			t.Errorf("docs/operations.md does not document serve's --%s", name)
		}
	}
}

// sameDefault reports whether a default as the docs write it is the one
// serve -h prints.
func sameDefault(name, doc, code string) bool {
	switch name {
	case "name", "epoch-check", "chain-key-file": // computed at start; -h describes them in words
		return doc != ""
	}
	if code == "" {
		return doc == "" || doc == "0" || doc == "off"
	}
	if doc == code {
		return true
	}
	d1, err1 := time.ParseDuration(doc)
	d2, err2 := time.ParseDuration(code)
	return err1 == nil && err2 == nil && d1 == d2
}
