package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClientTokenSources: the API commands' token comes from --token,
// --token-file, TASKLEDGER_TOKEN or TASKLEDGER_TOKEN_FILE: the command
// line over the environment, the later of the two flags, and of the two
// variables the file. A token file must hold a token on its first line.
// (Not parallel: it sets the environment.)
func TestClientTokenSources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  from-file \nsecond line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenOf := func(env map[string]string, args ...string) (string, error) {
		t.Helper()
		for _, k := range []string{"TASKLEDGER_TOKEN", "TASKLEDGER_TOKEN_FILE"} {
			t.Setenv(k, env[k])
			if _, ok := env[k]; !ok {
				os.Unsetenv(k)
			}
		}
		fs := newFlagSet("test")
		var cf clientFlags
		cf.register(fs)
		err := parse(fs, args)
		return cf.token, err
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"None", nil, nil, ""},
		{"Flag", nil, []string{"--token", "from-flag"}, "from-flag"},
		{"File", nil, []string{"--token-file", file}, "from-file"},
		{"LaterFileWins", nil, []string{"--token", "from-flag", "--token-file", file}, "from-file"},
		{"LaterFlagWins", nil, []string{"--token-file", file, "--token", "from-flag"}, "from-flag"},
		{"Environment", map[string]string{"TASKLEDGER_TOKEN": "from-env"}, nil, "from-env"},
		{"EnvironmentFile", map[string]string{"TASKLEDGER_TOKEN_FILE": file}, nil, "from-file"},
		{"EnvironmentFileOverVariable", map[string]string{"TASKLEDGER_TOKEN": "from-env", "TASKLEDGER_TOKEN_FILE": file}, nil, "from-file"},
		{"FlagOverEnvironment", map[string]string{"TASKLEDGER_TOKEN_FILE": file}, []string{"--token", "from-flag"}, "from-flag"},
		{"FileFlagOverEnvironment", map[string]string{"TASKLEDGER_TOKEN": "from-env"}, []string{"--token-file", file}, "from-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tokenOf(tc.env, tc.args...)
			if err != nil || got != tc.want {
				t.Fatalf("token %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	for name, args := range map[string][]string{
		"EmptyFile":   {"--token-file", empty},
		"MissingFile": {"--token-file", filepath.Join(dir, "missing")},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := tokenOf(nil, args...); err == nil || !strings.Contains(err.Error(), args[1]) {
				t.Fatalf("%v: %v, want an error naming the file", args, err)
			}
		})
	}
	t.Run("HelpWarns", func(t *testing.T) {
		fs := newFlagSet("test")
		var cf clientFlags
		cf.register(fs)
		if usage := fs.Lookup("token").Usage; !strings.Contains(usage, "process list") || !strings.Contains(usage, "--token-file") {
			t.Fatalf("--token's help %q does not warn", usage)
		}
	})
}
