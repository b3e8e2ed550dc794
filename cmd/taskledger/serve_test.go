package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

// `taskledger serve` refuses to listen beyond loopback without an auth
// file, and refuses a malformed auth file naming the line.

// serveOutput runs `taskledger serve args...` with env added, expecting it
// to exit on its own within 30s, and returns its exit code and stderr.
func serveOutput(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, taskledgerBinary(t), append([]string{"serve", "--data", t.TempDir(), "--log-format", "json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("serve %v did not exit: it is serving; stderr:\n%s", args, stderr.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

// freePublicPort returns a port that is free on every interface.
func freePublicPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// writeAuthFile writes content to a new auth file, mode 0600 as serve
// requires, and returns its path. Every word tok-NAME in content becomes
// testToken("tok-NAME"), a token as long as serve requires.
func writeAuthFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	content = regexp.MustCompile(`\btok-[A-Za-z0-9]+`).ReplaceAllStringFunc(content, testToken)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testToken is name padded to MinTokenLength characters: the token
// writeAuthFile writes for it.
func testToken(name string) string {
	if len(name) >= MinTokenLength {
		return name
	}
	return name + "-" + strings.Repeat("0", MinTokenLength-len(name)-1)
}

func TestServeRefusesPublicAddressWithoutAuthFile(t *testing.T) {
	t.Parallel()
	port := freePublicPort(t)
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"AllIPv4", nil, []string{"--http", "0.0.0.0:" + port}},
		{"AllIPv6", nil, []string{"--http", "[::]:" + port}},
		{"EmptyHost", nil, []string{"--http", ":" + port}},
		{"HostName", nil, []string{"--http", "example.com:" + port}},
		{"PrivateAddress", nil, []string{"--http", "10.1.2.3:" + port}},
		{"FromEnvironment", []string{"TASKLEDGER_HTTP=0.0.0.0:" + port}, nil},
		{"EmptyAuthFileFlag", nil, []string{"--http", "0.0.0.0:" + port, "--auth-file", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, stderr := serveOutput(t, tc.env, tc.args...)
			if code == 0 || !strings.Contains(stderr, "refusing to serve without --auth-file") || !strings.Contains(stderr, "not a loopback address") {
				t.Fatalf("exit %d, stderr:\n%s\nwant a non-zero exit and the refusal", code, stderr)
			}
		})
	}
}

func TestServeRefusesMalformedAuthFile(t *testing.T) {
	t.Parallel()
	path := writeAuthFile(t, "# tokens\n\ntok-a A\ntok-b B name extra\n")
	code, stderr := serveOutput(t, nil, "--http", "0.0.0.0:"+freePublicPort(t), "--auth-file", path)
	if code == 0 || !strings.Contains(stderr, path+":4:") {
		t.Fatalf("exit %d, stderr:\n%s\nwant a non-zero exit naming %s:4", code, stderr, path)
	}
	code, stderr = serveOutput(t, nil, "--auth-file", filepath.Join(t.TempDir(), "missing"))
	if code == 0 || !strings.Contains(stderr, "missing") {
		t.Fatalf("missing auth file: exit %d, stderr:\n%s", code, stderr)
	}
}

func TestServeReadAuthFile(t *testing.T) {
	t.Parallel()
	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		path := writeAuthFile(t, "# comment\n\n  tok-a   A  # customer A\r\ntok-op * ops-alice\n\ttok-b\tB_2-x\tci-bot\n")
		tokens, names, err := readAuthFile(path, false)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{testToken("tok-a"): "A", testToken("tok-op"): "*", testToken("tok-b"): "B_2-x"}
		if fmt.Sprint(tokens) != fmt.Sprint(want) {
			t.Fatalf("tokens %v, want %v", tokens, want)
		}
		if want := map[string]string{testToken("tok-op"): "ops-alice", testToken("tok-b"): "ci-bot"}; fmt.Sprint(names) != fmt.Sprint(want) {
			t.Fatalf("names %v, want %v", names, want)
		}
	})
	for _, tc := range []struct{ name, content, want string }{
		{"TokenOnly", "tok-a A\ntok-b\n", ":2:"},
		{"FourFields", "tok-a A name extra\n", ":1:"},
		{"NameWithDot", "tok-a A ops.alice\n", ":1:"},
		{"CustomerWithDot", "\n\ntok-a a.b\n", ":3:"},
		{"CustomerWildcard", "tok-a >\n", ":1:"},
		{"CustomerStarPrefix", "tok-a *A\n", ":1:"},
		{"CustomerTooLong", "tok-a " + strings.Repeat("c", 65) + "\n", ":1:"},
		{"CustomerUnicode", "tok-a é\n", ":1:"},
		{"RepeatedToken", "tok-a A\n# again\ntok-a B\n", ":3: token repeats the one on line 1"},
		{"RepeatedTokenSameCustomer", "tok-a A\ntok-a A\n", ":2:"},
		{"NoTokens", "# nothing\n\n", "no tokens"},
		{"Empty", "", "no tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeAuthFile(t, tc.content)
			tokens, _, err := readAuthFile(path, false)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), path) {
				t.Fatalf("tokens %v, error %v; want an error starting with %s and holding %q", tokens, err, path, tc.want)
			}
			if strings.Contains(err.Error(), "tok-a") {
				t.Fatalf("error %v shows a token", err)
			}
		})
	}
}

// TestServeAuthFileStrength: an auth file its group or others may read
// or change, or a token shorter than MinTokenLength, is refused naming
// the file (and the line) without showing the token; with
// --insecure-auth-file both are accepted.
func TestServeAuthFileStrength(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"GroupReadable", "tok-a A\n", 0o640, "mode 0640"},
		{"WorldReadable", "tok-a A\n", 0o644, "mode 0644"},
		{"GroupWritable", "tok-a A\n", 0o620, "mode 0620"},
		{"ShortToken", "tok-a A\nshort-secret B\n", 0o600, ":2: token of 12 characters: want at least 32"},
		{"OneShortOfMinimum", "tok-a A\n" + strings.Repeat("s", MinTokenLength-1) + " B\n", 0o600, ":2: token of 31 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeAuthFile(t, tc.content)
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			tokens, _, err := readAuthFile(path, false)
			if err == nil || !strings.HasPrefix(err.Error(), path) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--insecure-auth-file") {
				t.Fatalf("tokens %v, error %v; want one starting with %s, holding %q and naming the override", tokens, err, path, tc.want)
			}
			if strings.Contains(err.Error(), "short-secret") || strings.Contains(err.Error(), "sss") {
				t.Fatalf("error %v shows a token", err)
			}
			if tokens, _, err := readAuthFile(path, true); err != nil || len(tokens) == 0 {
				t.Fatalf("with --insecure-auth-file: tokens %v, error %v", tokens, err)
			}
		})
	}
	t.Run("ServeRefuses", func(t *testing.T) {
		t.Parallel()
		path := writeAuthFile(t, "tok-a A\n")
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		code, stderr := serveOutput(t, nil, "--auth-file", path)
		if code == 0 || !strings.Contains(stderr, "chmod 600") {
			t.Fatalf("serve with a world-readable auth file: exit %d, stderr:\n%s", code, stderr)
		}
	})
	t.Run("Exactly32", func(t *testing.T) {
		t.Parallel()
		path := writeAuthFile(t, strings.Repeat("x", MinTokenLength)+" A\n")
		if tokens, _, err := readAuthFile(path, false); err != nil || len(tokens) != 1 {
			t.Fatalf("a %d-character token: %v %v", MinTokenLength, tokens, err)
		}
	})
}

func TestServeWithAuthFileOnPublicAddress(t *testing.T) {
	t.Parallel()
	port := freePublicPort(t)
	path := writeAuthFile(t, "tok-a A\ntok-op *\n")
	metricsAddr := freeAddr(t)
	cmd := exec.Command(taskledgerBinary(t), "serve", "--data", t.TempDir(), "--http", "0.0.0.0:"+port,
		"--auth-file", path, "--metrics-http", metricsAddr, "--metrics-hosts", "prometheus.internal", "--log-format", "json", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
		}
	})

	base := "http://127.0.0.1:" + port
	anon := api.NewClient(base, "")
	defer anon.HTTP.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := anon.HTTP.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("serve with --auth-file on 0.0.0.0 exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server on 0.0.0.0:%s not healthy: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	ctx := context.Background()
	_, err := anon.List(ctx, api.ListOptions{})
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized || apiErr.Code != "unauthenticated" {
		t.Fatalf("list without a token: %v, want 401 unauthenticated", err)
	}
	ca := api.NewClient(base, testToken("tok-a"))
	defer ca.HTTP.CloseIdleConnections()
	task, _, err := ca.Schedule(ctx, api.ScheduleRequest{Queue: "serve"})
	if err != nil || task.CustomerID != "A" {
		t.Fatalf("schedule with A's token: %v %+v", err, task)
	}
	op := api.NewClient(base, testToken("tok-op"))
	defer op.HTTP.CloseIdleConnections()
	if got, err := op.Get(ctx, task.ID); err != nil || got.CustomerID != "A" {
		t.Fatalf("operator reads A's task: %v %+v", err, got)
	}

	// The API's /metrics needs the operator's token; --metrics-http
	// serves it without one, and nothing else.
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := anon.HTTP.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if status, _ := get(base + "/metrics"); status != http.StatusUnauthorized {
		t.Fatalf("API /metrics without a token: %d, want 401", status)
	}
	if status, body := get("http://" + metricsAddr + "/metrics"); status != http.StatusOK || !strings.Contains(body, `taskledger_tasks{queue="serve"`) {
		t.Fatalf("--metrics-http /metrics: %d, want 200 with the tasks gauge", status)
	}
	if status, _ := get("http://" + metricsAddr + "/v1/tasks"); status != http.StatusNotFound {
		t.Fatalf("--metrics-http /v1/tasks: %d, want 404", status)
	}
	// A DNS-rebinding page's Host is refused; a name of --metrics-hosts
	// is served.
	_, port2, _ := net.SplitHostPort(metricsAddr)
	for host, want := range map[string]int{"evil.example:" + port2: http.StatusForbidden, "prometheus.internal:" + port2: http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
		req.Host = host
		resp, err := anon.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("--metrics-http with Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}

	// The CLI takes its token from --token-file or TASKLEDGER_TOKEN too.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(testToken("tok-a")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"TokenFile", nil, []string{"--token-file", tokenFile}},
		{"Environment", []string{"TASKLEDGER_TOKEN=" + testToken("tok-a")}, nil},
		{"FileOverEnvironment", []string{"TASKLEDGER_TOKEN=nope"}, []string{"--token-file", tokenFile}},
	} {
		cli := exec.Command(taskledgerBinary(t), append([]string{"show", task.ID, "--json", "--server", base}, tc.args...)...)
		cli.Env = append(os.Environ(), tc.env...)
		out, err := cli.CombinedOutput()
		if err != nil || !strings.Contains(string(out), task.ID) {
			t.Fatalf("%s: show %s: %v\n%s", tc.name, task.ID, err, out)
		}
	}

	// SIGTERM shuts it down cleanly.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not stop after SIGTERM")
	}
}

func TestServeRefusesBadRetain(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"0", "-2", "x"} {
		code, stderr := serveOutput(t, nil, "--retain", v)
		if code != 2 || !strings.Contains(stderr, "retain") {
			t.Errorf("--retain %s: exit %d, stderr:\n%s\nwant exit 2 naming --retain", v, code, stderr)
		}
	}
}

func TestServeRefusesBadLimits(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--max-lineage-tasks", "0"}, {"--max-lineage-tasks", "-2"},
		{"--max-lineage-depth", "0"}, {"--max-lineage-depth", "-2"},
		{"--max-event-bytes", "-1"}, {"--max-event-bytes", "4294967296"},
		{"--max-streams", "0"}, {"--max-streams-per-customer", "-2"},
		{"--timer-partitions", "0"}, {"--timer-partitions", "1025"}, {"--lease-ttl", "500ms"}, {"--lease-ttl", "2h"},
		{"--shards", "0"}, {"--shards", "65"},
		{"--epoch-slots", "1"}, {"--epoch-slots", "17"}, {"--epoch-slots", "-1"}, {"--epoch-slots", "2", "--retain-epochs", "2"},
		{"--epoch-slots", "3", "--epoch-period", "500ms"}, {"--epoch-slots", "3", "--retain-epochs", "0"},
	} {
		code, stderr := serveOutput(t, nil, args...)
		if code != 2 || !strings.Contains(stderr, args[0]) {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant exit 2 naming %s", args, code, stderr, args[0])
		}
	}
}

// TestServeHTTPLimitFlags: the edge's limits are serve's flags, and its
// refusals answer JSON.
func TestServeHTTPLimitFlags(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	p := startServer(t, t.TempDir(), addr, "--max-header-bytes", "2048", "--max-conns", "4", "--body-timeout", "300ms", "--idle-timeout", "1m")
	p.client.HTTP.CloseIdleConnections()
	// exchange sends raw on a new connection, left open, and reads one
	// answer.
	exchange := func(raw string) (int, string, error) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return 0, "", err
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		go conn.Write([]byte(raw))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	want := func(raw string, status int, code string) {
		t.Helper()
		got, body, err := exchange(raw)
		if err != nil {
			t.Fatalf("%.40q: %v", raw, err)
		}
		if got != status || !strings.Contains(body, `"error":"`+code+`"`) {
			t.Fatalf("%.40q: %d %s, want %d %s", raw, got, body, status, code)
		}
	}
	want("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: "+strings.Repeat("a", 8192)+"\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge, "header_too_large")
	want("POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{", http.StatusRequestTimeout, "request_timeout")
	want("GET /healthz HTTP/1.1\r\nHost: evil.example\r\n\r\n", http.StatusForbidden, "forbidden")
	// Keep-alive connections up to --max-conns; one more is refused (a
	// 503, or a close if it beat the request).
	for i := 0; ; i++ {
		status, body, err := exchange("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
		if err != nil || status == http.StatusServiceUnavailable {
			if err == nil && !strings.Contains(body, `"error":"unavailable"`) {
				t.Fatalf("refused connection: %s, want the JSON error", body)
			}
			break
		}
		if i == 8 {
			t.Fatal("9 connections held open with --max-conns 4")
		}
	}
}
