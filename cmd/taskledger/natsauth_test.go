package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/testlog"
)

// writeTokenFile writes a new --nats-token-file, readable by its owner
// only, and returns its path.
func writeTokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats-token")
	if err := os.WriteFile(path, []byte(events.NewID()+events.NewID()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// securedServe is `taskledger serve` exposing its NATS port with an
// auth file and taskledger's own token file.
type securedServe struct {
	data, httpAddr, natsAddr, auth, tokenFile string
}

const (
	natsTokA  = "nats-a-0123456789abcdef0123456789abcdef"
	natsTokB  = "nats-b-0123456789abcdef0123456789abcdef"
	natsTokOp = "nats-op-0123456789abcdef0123456789abcdef"
)

func newSecuredServe(t *testing.T) *securedServe {
	return &securedServe{data: t.TempDir(), httpAddr: freeAddr(t), natsAddr: freeAddr(t),
		auth:      writeAuthFile(t, natsTokA+" A\n"+natsTokB+" B\n"+natsTokOp+" *\n"),
		tokenFile: writeTokenFile(t)}
}

func (s *securedServe) cmd(t *testing.T, logs *testlog.Buffer, flags ...string) *exec.Cmd {
	args := append([]string{"serve", "--data", s.data, "--http", s.httpAddr, "--nats-listen", s.natsAddr,
		"--auth-file", s.auth, "--nats-token-file", s.tokenFile, "--log-format", "json", "--log-level", "warn"}, flags...)
	cmd := exec.Command(taskledgerBinary(t), args...)
	cmd.Stderr = logs
	return cmd
}

// start runs the server and waits until it answers the operator.
func (s *securedServe) start(t *testing.T, flags ...string) *process {
	t.Helper()
	logs := &testlog.Buffer{}
	cmd := s.cmd(t, logs, flags...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, client: api.NewClient("http://"+s.httpAddr, natsTokOp)}
	t.Cleanup(p.kill)
	waitFor(t, "the server answering", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := p.client.List(ctx, api.ListOptions{Limit: 1})
		if p.cmd.ProcessState != nil {
			t.Fatalf("server exited: %s", logs.String())
		}
		return err == nil
	})
	return p
}

// natsClient connects to the exposed port with token and inbox prefix,
// collecting the permission violations the server reports.
func natsClient(t *testing.T, url, token, inbox string) (*nats.Conn, chan error) {
	t.Helper()
	violations := make(chan error, 32)
	nc, err := nats.Connect(url, nats.Token(token), nats.CustomInboxPrefix(inbox), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, violations
}

// wantViolation waits for the server's permission violation naming subject.
func wantViolation(t *testing.T, violations chan error, subject string) {
	t.Helper()
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Fatalf("got %v, want a permission violation for %q", err, subject)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no permission violation for %q", subject)
	}
}

// TestNATSListenSecured runs serve with --nats-listen, an auth file and
// a token file. A connection without credentials is refused; customer
// A's token (an executor's, or a stolen one) and the operator's can
// neither read B's events, publish an event, nor delete or purge the
// stream; the operator's can make an API request. Once the stream is
// deleted (by taskledger's own token, as an outside deletion), /readyz
// answers 503, and a restart refuses the emptied log until
// --allow-empty-log.
func TestNATSListenSecured(t *testing.T) {
	t.Parallel()
	s := newSecuredServe(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := s.start(t)
	b := api.NewClient("http://"+s.httpAddr, natsTokB)
	task, _, err := b.Schedule(ctx, api.ScheduleRequest{Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	replayStopServer(t, p) // saves the chain head
	p = s.start(t)
	url := "nats://" + s.natsAddr

	if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was admitted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a connection without credentials: %v, want an authorization violation", err)
	}
	subjects := events.DefaultSubjects
	stream := events.DefaultStream
	for _, c := range []struct{ token, inbox string }{{natsTokA, api.NATSInbox("A")}, {natsTokOp, api.NATSOperatorInbox}} {
		nc, violations := natsClient(t, url, c.token, c.inbox)
		for _, subject := range []string{subjects.Events(), subjects.Customer("B")} {
			if _, err := nc.SubscribeSync(subject); err != nil {
				t.Fatal(err)
			}
			wantViolation(t, violations, subject)
		}
		forged := subjects.Event("B", task.ID)
		if err := nc.Publish(forged, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, violations, forged)
		for _, subject := range []string{"$JS.API.STREAM.DELETE." + stream, "$JS.API.STREAM.PURGE." + stream, "$JS.API.STREAM.INFO." + stream} {
			if msg, err := nc.Request(subject, nil, 500*time.Millisecond); err == nil {
				t.Fatalf("%s answered: %s", subject, msg.Data)
			}
			wantViolation(t, violations, subject)
		}
	}
	op, _ := natsClient(t, url, natsTokOp, api.NATSOperatorInbox)
	if got, err := api.NewNATSClient(op, "", "B", natsTokOp).Get(ctx, task.ID); err != nil || got.ID != task.ID {
		t.Fatalf("operator's API request over NATS: %+v %v", got, err)
	}
	if h, err := b.History(ctx, task.ID); err != nil || len(h.Events) == 0 {
		t.Fatalf("B's history after the attempts: %v", err)
	}
	if code := readyzStatus(t, s.httpAddr); code != http.StatusOK {
		t.Fatalf("/readyz before the deletion: %d", code)
	}

	// taskledger's own token may delete the stream: as an outside deletion.
	token, err := os.ReadFile(s.tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	own, err := nats.Connect(url, nats.Token(strings.TrimSpace(string(token))))
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	js, err := jetstream.New(own)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, stream); err != nil {
		t.Fatal(err)
	}
	if code := readyzStatus(t, s.httpAddr); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz after the deletion: %d, want 503", code)
	}
	own.Close()
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.cmd.Wait()

	var logs testlog.Buffer
	out, err := s.cmd(t, &logs).Output()
	if err == nil || !strings.Contains(logs.String(), "--allow-empty-log") {
		t.Fatalf("restart over the deleted stream: %v\n%s%s, want a refusal naming --allow-empty-log", err, out, logs.String())
	}
	p = s.start(t, "--allow-empty-log")
	replayStopServer(t, p)
}

// readyzStatus returns /readyz's status code.
func readyzStatus(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestServeRefusesOpenNATSListen: --nats-listen without an auth file or
// a token file would admit nobody: a usage error. A token file others
// may read, or a short token, is refused.
func TestServeRefusesOpenNATSListen(t *testing.T) {
	t.Parallel()
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("tooshort"), 0o600); err != nil {
		t.Fatal(err)
	}
	readable := writeTokenFile(t)
	if err := os.Chmod(readable, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "admits no connection without credentials"},
		{[]string{"--nats-token-file", short}, "at least 32 characters"},
		{[]string{"--nats-token-file", readable}, "chmod 600"},
	} {
		args := append([]string{"serve", "--data", t.TempDir(), "--http", freeAddr(t), "--nats-listen", "127.0.0.1:0"}, c.args...)
		out, err := exec.Command(taskledgerBinary(t), args...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Fatalf("serve %v: %v\n%s\nwant exit 2 saying %q", c.args, err, out, c.want)
		}
	}
}

// TestWarnRemoteBypass: a --nats-url server that lets a connection
// without credentials read the log's stream gets a warning; one that
// refuses such a connection does not.
func TestWarnRemoteBypass(t *testing.T) {
	t.Parallel()
	open, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	open.Start()
	t.Cleanup(open.Shutdown)
	if !open.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	secured, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0",
		Clients: broker.Clients{Tokens: map[string]string{natsTokOp: "*"}, Root: "tl"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(secured.Shutdown)
	ownSecured, err := secured.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer ownSecured.Close()
	ownOpen, err := nats.Connect(open.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer ownOpen.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, nc := range []*nats.Conn{ownOpen, ownSecured} {
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"tl.evt.>"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		url  string
		warn bool
	}{{open.ClientURL(), true}, {secured.ClientURL(), false}} {
		var logs testlog.Buffer
		warnRemoteBypass(ctx, zerolog.New(&logs), broker.RemoteConfig{URL: c.url, Token: natsTokOp}, "LOG")
		warned := strings.Contains(logs.String(), `"level":"warn"`) && strings.Contains(logs.String(), "without credentials can use the JetStream API")
		if warned != c.warn {
			t.Fatalf("%s: warned %v, want %v:\n%s", c.url, warned, c.warn, logs.String())
		}
	}
}

// TestNATSPermissionsSnippet runs a nats-server on docs/operations.md's
// "NATS permissions" configuration, its placeholder keys replaced by
// fresh ones: a connection without credentials is refused; taskledger's
// user may use the JetStream API and serve the API requests; acme's
// executor and the operator may send API requests (acme its own only)
// but not use the JetStream API.
func TestNATSPermissionsSnippet(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n### NATS permissions\n.*?```\n(accounts \\{.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/operations.md has no "NATS permissions" configuration`)
	}
	cfg := string(m[1])
	keys := map[string]nkeys.KeyPair{}
	for _, placeholder := range []string{"UTASKLEDGER...", "UEXECACME...", "UOPERATOR...", "USYSADMIN..."} {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		if !strings.Contains(cfg, placeholder) {
			t.Fatalf("the configuration has no %s", placeholder)
		}
		cfg, keys[placeholder] = strings.ReplaceAll(cfg, placeholder, pub), kp
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "nats.conf")
	cfg += "\nlisten: 127.0.0.1:-1\njetstream {store_dir: \"" + dir + "\"}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("the documented configuration: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	connect := func(placeholder, inbox string) *nats.Conn {
		t.Helper()
		kp := keys[placeholder]
		pub, _ := kp.PublicKey()
		nc, err := nats.Connect(srv.ClientURL(), nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(inbox), nats.MaxReconnects(0))
		if err != nil {
			t.Fatalf("%s: %v", placeholder, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	if nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was admitted")
	}
	own := connect("UTASKLEDGER...", "_INBOX")
	if _, err := own.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Fatalf("taskledger's user and the JetStream API: %v", err)
	}
	// Answers on the API subjects, and on an event subject, so that a
	// request there is refused by the permissions or answered.
	for _, subject := range []string{"tl.api.*.>", "tl.evt.>"} {
		if _, err := own.Subscribe(subject, func(m *nats.Msg) { m.Respond([]byte("ok")) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := own.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ user, inbox, allowed, denied string }{
		{"UEXECACME...", api.NATSInbox("acme"), "tl.api.acme.req", "tl.api.beta.req"},
		{"UOPERATOR...", api.NATSOperatorInbox, "tl.api.beta.req", "tl.evt.beta.t1"},
	} {
		nc := connect(c.user, c.inbox)
		if msg, err := nc.Request(c.allowed, nil, 5*time.Second); err != nil || string(msg.Data) != "ok" {
			t.Fatalf("%s's request on %s: %v", c.user, c.allowed, err)
		}
		for _, subject := range []string{c.denied, "$JS.API.INFO", "$JS.API.STREAM.DELETE.TASKLEDGER"} {
			if _, err := nc.Request(subject, nil, 300*time.Millisecond); err == nil {
				t.Fatalf("%s's request on %s answered", c.user, subject)
			}
		}
	}
}
