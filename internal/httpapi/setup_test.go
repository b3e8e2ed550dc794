package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// bundle is one running scheduler behind a real HTTP server.
type bundle struct {
	node   *node.Node
	client *api.Client
	url    string
}

// setup starts a scheduler node on a fresh stream of the package's NATS
// server, serves its API over HTTP, every exchange held against
// docs/openapi.yaml (validated), and waits until it is ready.
func setup(t *testing.T, cfgs ...func(*node.Config)) *bundle {
	t.Helper()
	opts := []testnode.Option{func(c *node.Config) {
		c.Middleware = func(h http.Handler) http.Handler { return validated(t, h) }
	}}
	for _, f := range cfgs {
		opts = append(opts, f)
	}
	n := testnode.Start(t, opts...)
	return &bundle{node: n.Node, client: n.Client, url: n.URL}
}

// eventually polls cond until it holds, failing the test after 30s.
var eventually = testnode.Eventually

// waitStatus polls a task until it has status and returns it.
func (b *bundle) waitStatus(t *testing.T, id, status string) api.Task {
	t.Helper()
	var task api.Task
	eventually(t, "task "+id+" "+status, func() bool {
		var err error
		task, err = b.client.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return task.Status == status
	})
	return task
}

// apiError asserts err is an API error with status code and reason.
func apiError(t *testing.T, err error, status int, reason string) {
	t.Helper()
	var e *api.Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v, want API error %d", err, status)
	}
	if e.Status != status || e.Reason != reason {
		t.Fatalf("got %d %s (%s), want %d %s", e.Status, e.Code, e.Reason, status, reason)
	}
}
