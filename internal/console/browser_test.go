package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// The tokens of the console tests' server.
const (
	operatorToken = "op-secret"
	acmeToken     = "acme-secret"
	bobToken      = "bob-secret"
)

// chromiumPath finds Debian's chromium on PATH. Under CI (CI set) a
// missing browser fails the test: .ci/run installs it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not on PATH; install it with apt-get install -y chromium (.ci/run does)")
	}
	t.Skip("chromium is not on PATH (apt-get install -y chromium); under CI this fails")
	return ""
}

// console is a server with auth and a headless Chromium driving its
// console; errors collects the page's JavaScript exceptions, console
// errors and CSP violations.
type console struct {
	node     *testnode.Node
	opts     []testnode.Option      // the node's, for a restart
	backend  atomic.Pointer[string] // the server's URL
	url      string
	operator *api.Client
	acme     *api.Client
	browser  context.Context

	mu     sync.Mutex
	errors []string
}

func setup(t *testing.T, nodeOpts ...testnode.Option) *console {
	t.Helper()
	chromium := chromiumPath(t)
	nodeOpts = append([]testnode.Option{withTokens}, nodeOpts...)
	n := testnode.Start(t, nodeOpts...)
	// The browser talks to a proxy that stays when the server behind it
	// restarts (on another port).
	c := &console{node: n, opts: nodeOpts}
	c.backend.Store(&n.URL)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			u, _ := url.Parse(*c.backend.Load())
			r.SetURL(u)
			r.Out.Host = r.In.Host
		},
		FlushInterval: -1, // the event stream
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)
	c.url = front.URL
	c.operator, c.acme = api.NewClient(front.URL, operatorToken), api.NewClient(front.URL, acmeToken)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	c.browser = ctx
	if err := chromedp.Do(ctx); err != nil { // start the browser
		t.Fatal(err)
	}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			// A 401 while logging in is the API's answer, not a page fault.
			if m.IsException() || m.Type == chromedp.ConsoleError && m.Source != "network" {
				c.mu.Lock()
				c.errors = append(c.errors, m.String())
				c.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// withTokens gives the server its auth file.
func withTokens(c *node.Config) {
	c.Tokens = map[string]string{operatorToken: "*", acmeToken: "acme", bobToken: "bob"}
}

// restart stops the server and starts another on the same log, behind
// the same proxy.
func (c *console) restart(t *testing.T) {
	t.Helper()
	c.node.Stop()
	c.node = testnode.Start(t, append([]testnode.Option{testnode.On(c.node.NC, c.node.NS)}, c.opts...)...)
	c.backend.Store(&c.node.URL)
}

func (c *console) run(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(c.browser, steps...); err != nil {
		t.Fatal(err)
	}
}

// value runs the action in the page and answers its value.
func value[T any](t *testing.T, c *console, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(c.browser, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// noErrors fails the test with every error the page reported so far.
func (c *console) noErrors(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.errors {
		t.Errorf("page error: %s", e)
	}
}

// login opens the console, forgetting any token, and logs in with tok.
func (c *console) login(t *testing.T, tok string) {
	t.Helper()
	c.run(t,
		chromedp.Navigate(c.url+"/ui/"),
		chromedp.Evaluate[chromedp.Void](`sessionStorage.clear()`),
		chromedp.Navigate(c.url+"/ui"), // redirected to /ui/
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), tok),
		chromedp.Click(chromedp.CSS(`form.login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-page="overview"] .cards`)),
	)
}

// open goes to a console page by its hash and waits for sel.
func (c *console) open(t *testing.T, hash, sel string) {
	t.Helper()
	c.run(t, chromedp.Navigate(c.url+"/ui/"+hash), chromedp.WaitVisible(chromedp.CSS(sel)))
}

// click clicks the element sel names inside the page in one step, once
// it is there: live updates may redraw it between chromedp finding a node
// and clicking it (the node id goes stale).
func (c *console) click(t *testing.T, sel string) {
	t.Helper()
	c.poll(t, fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true })()`, sel))
}

// poll waits until the JavaScript expression is true in the page.
func (c *console) poll(t *testing.T, expr string) {
	t.Helper()
	c.run(t, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(30*time.Second)))
}

// schedule schedules req and returns the task once its writes are all in
// (testnode.Settled), so the tests count its events settled.
func schedule(t *testing.T, cl *api.Client, req api.ScheduleRequest) api.Task {
	t.Helper()
	task, _, err := cl.Schedule(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return testnode.Settled(t, cl, task)
}

func text(s string) events.Message {
	return events.Message{Content: []events.ContentPart{{Type: "text", Text: s}}}
}

func row(id string) string { return fmt.Sprintf(`tr[data-id=%q]`, id) }

// nightly is the console tests' schedule.
var nightly = api.ScheduleCreateRequest{ID: "nightly", Cron: "0 2 * * *", Task: api.ScheduleTask{Queue: "nightly", Message: text("run the nightly build")}}

// storefrontKey is the concurrency key of storefront tasks, one at a time.
const storefrontKey = "repo:acme/storefront"

func storefront(msg string) api.ScheduleRequest {
	return api.ScheduleRequest{Queue: "deploy", Message: text(msg), Concurrency: &events.Concurrency{Key: storefrontKey, Limit: 1}}
}

// TestConsole drives the console in one headless Chromium, as a
// customer: its scenarios share the browser and the server, in order.
func TestConsole(t *testing.T) {
	t.Parallel()
	c := setup(t)
	ctx := context.Background()
	bobs := schedule(t, c.operator, api.ScheduleRequest{CustomerID: "bob", Queue: "bobq", Message: text("bob's secret")})
	first := schedule(t, c.acme, api.ScheduleRequest{Queue: "build", Message: text("first acme task")})

	t.Run("CustomerSeesOnlyItsTasks", func(t *testing.T) {
		c.login(t, acmeToken)
		c.open(t, "#/tasks", row(first.ID))
		c.poll(t, fmt.Sprintf(`document.querySelector(%q) === null && [...document.querySelectorAll("#tasks tbody tr")].length === 1`, row(bobs.ID)))
	})

	var live api.Task
	t.Run("TaskAppearsLive", func(t *testing.T) {
		live = schedule(t, c.acme, api.ScheduleRequest{Queue: "build", Message: text("appears without a reload\nsecond line")})
		c.run(t, chromedp.WaitVisible(chromedp.CSS(row(live.ID))))
		// The message cell shows the first line; read inside the page, as
		// a live redraw may replace the row.
		c.poll(t, fmt.Sprintf(`document.querySelector(%q)?.textContent === "appears without a reload"`, row(live.ID)+" td:last-child"))
	})

	t.Run("TimelineGrows", func(t *testing.T) {
		c.open(t, "#/task/"+live.ID, `#timeline [data-type="TaskScheduled"]`)
		claimed, ok, err := c.acme.ClaimNext(ctx, "build", "w1", time.Second)
		if err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
		if claimed.ID != first.ID && claimed.ID != live.ID {
			t.Fatalf("claimed %s", claimed.ID)
		}
		if claimed.ID == first.ID { // the oldest comes first; finish it and take ours
			if _, err := c.acme.RecordResult(ctx, first.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true}); err != nil {
				t.Fatal(err)
			}
			if claimed, _, err = c.acme.ClaimNext(ctx, "build", "w1", time.Second); err != nil || claimed.ID != live.ID {
				t.Fatalf("claim: %s %v", claimed.ID, err)
			}
		}
		c.run(t, chromedp.WaitVisible(chromedp.CSS(`#timeline [data-type="Claimed"]`)))
		// The page follows the running task's Run live: each save's new
		// transcript items and each progress line, shown as text.
		run := api.RunState{Phase: "thinking", Turn: 1, Transcript: []api.TranscriptItem{
			{ID: "t1.i1", Kind: api.ItemModelOutput, Turn: 1, Content: []events.ContentPart{{Type: "text", Text: "<b>not html</b>"}}},
		}}
		if _, err := c.acme.SaveRun(ctx, live.ID, api.RunSave{DeliveryID: claimed.Claim.DeliveryID, Run: run}); err != nil {
			t.Fatal(err)
		}
		c.poll(t, `document.querySelector("#run-live-state")?.textContent === "following: revision 1" && document.querySelector("#run-live").textContent.includes("[model_output] <b>not html</b>")`)
		for _, tok := range []string{"stream", "ing ", "tokens…"} {
			if err := c.acme.Progress(ctx, live.ID, claimed.Claim.DeliveryID, tok); err != nil {
				t.Fatal(err)
			}
		}
		c.poll(t, `document.querySelector("#run-live").textContent.endsWith("streaming tokens…") && document.querySelector("#run-live b") === null`)
		if _, err := c.acme.RecordResult(ctx, live.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true, Summary: "all green"}); err != nil {
			t.Fatal(err)
		}
		c.run(t, chromedp.WaitVisible(chromedp.CSS(`#timeline [data-type="ResultRecorded"]`)))
		c.poll(t, `document.querySelector("h1 .status").dataset.status === "succeeded" && document.querySelector("#result").textContent.includes("all green")`)
		c.poll(t, `document.querySelector("#run-live-state").textContent === "ended: succeeded"`)
	})

	t.Run("PostMailboxMessage", func(t *testing.T) {
		task := schedule(t, c.acme, api.ScheduleRequest{Queue: "mail", Message: text("waits for mail")})
		c.open(t, "#/task/"+task.ID, "#mail-text")
		c.run(t,
			chromedp.SendKeys(chromedp.CSS("#mail-text"), "please also update the docs"),
			chromedp.Click(chromedp.CSS(`#mail-form button[type="submit"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#mailbox li[data-index="1"]`)),
		)
		m, err := c.acme.Mailbox(ctx, task.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Messages) != 1 || m.Messages[0].Content[0].Text != "please also update the docs" {
			t.Fatalf("mailbox %+v", m.Messages)
		}
	})

	t.Run("CancelFromTable", func(t *testing.T) {
		task := schedule(t, c.acme, api.ScheduleRequest{Queue: "cancelme", Message: text("cancel me")})
		c.open(t, "#/tasks?queue=cancelme", row(task.ID))
		// Live updates may redraw the row between finding and clicking it
		// (chromedp's node id goes stale), so the box is ticked inside the
		// page in one step; a selected row pauses the live updates.
		c.poll(t, fmt.Sprintf(`(() => { const b = document.querySelector(%q); if (!b) return false; if (!b.checked) b.click(); return b.checked })()`,
			row(task.ID)+` input[type="checkbox"]`))
		c.run(t,
			chromedp.Click(chromedp.CSS("#bulk-cancel")),
			chromedp.WaitVisible(chromedp.CSS(row(task.ID)+` [data-status="canceled"]`)),
		)
		got, err := c.acme.Get(ctx, task.ID)
		if err != nil || got.Status != "canceled" {
			t.Fatalf("task %s %v", got.Status, err)
		}
	})

	// The console offers a filter for every query parameter the list
	// route documents; queue and label, through the form.
	t.Run("FilterByQueue", func(t *testing.T) {
		other := schedule(t, c.acme, api.ScheduleRequest{Queue: "other", Message: text("on another queue")})
		c.open(t, "#/tasks", "#f-queue")
		c.run(t,
			chromedp.SetValue(chromedp.CSS("#f-queue"), "other"),
			chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)),
		)
		c.poll(t, fmt.Sprintf(`location.hash === "#/tasks?queue=other" && document.querySelectorAll("#tasks tbody tr").length === 1 && document.querySelector(%q) !== null`, row(other.ID)))
	})

	t.Run("FilterByLabel", func(t *testing.T) {
		ops := schedule(t, c.acme, api.ScheduleRequest{Queue: "labeled", Message: text("for ops"), Labels: map[string]string{"team": "ops", "env": "prod"}})
		dev := schedule(t, c.acme, api.ScheduleRequest{Queue: "labeled", Message: text("for dev"), Labels: map[string]string{"team": "dev", "env": "prod"}})
		c.open(t, "#/tasks?queue=labeled", row(dev.ID))
		c.run(t,
			chromedp.SetValue(chromedp.CSS("#f-label"), "team=ops env=prod"),
			chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)),
		)
		c.poll(t, fmt.Sprintf(`document.querySelectorAll("#tasks tbody tr").length === 1 && document.querySelector(%q) !== null && document.querySelector(%q).textContent.includes("team=ops")`,
			row(ops.ID), row(ops.ID)))
	})

	// A task's kind and payload, and its result's output, show as text
	// (indented JSON), never as markup; the list filters by kind.
	t.Run("KindAndPayload", func(t *testing.T) {
		const html = `<img src=x onerror="document.title='pwned'">`
		task := schedule(t, c.acme, api.ScheduleRequest{Queue: "kinds", Message: text("resize it"), Kind: "resize",
			Payload: json.RawMessage(`{"src":"cat.png","width":64,"note":` + strconv.Quote(html) + `}`)})
		plain := schedule(t, c.acme, api.ScheduleRequest{Queue: "kinds", Message: text("no kind")})
		claimed, ok, err := c.acme.ClaimNext(ctx, "kinds", "w-kinds", 10*time.Second)
		if err != nil || !ok || claimed.ID != task.ID {
			t.Fatalf("claim: %s %v %v", claimed.ID, ok, err)
		}
		if _, err := c.acme.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true,
			Output: json.RawMessage(`{"thumb":"cat-64.png","alt":` + strconv.Quote(html) + `}`)}); err != nil {
			t.Fatal(err)
		}
		c.open(t, "#/task/"+task.ID, "#payload")
		c.poll(t, `document.querySelector("h1 .status")?.dataset.status === "succeeded" && document.querySelector("#output") !== null`)
		payload := value(t, c, chromedp.Evaluate[string](`document.querySelector("#payload").textContent`))
		output := value(t, c, chromedp.Evaluate[string](`document.querySelector("#output").textContent`))
		if !strings.Contains(payload, `"width": 64`) || !strings.Contains(payload, `"src": "cat.png"`) || !strings.Contains(output, `"thumb": "cat-64.png"`) {
			t.Fatalf("payload shown as %q, output as %q; want indented JSON", payload, output)
		}
		if !strings.Contains(payload, `<img src=x`) || !strings.Contains(output, `<img src=x`) {
			t.Fatalf("the markup in the payload %q or output %q is not shown as text", payload, output)
		}
		if n := value(t, c, chromedp.Evaluate[int](`document.querySelectorAll("#payload *, #output *").length`)); n != 0 {
			t.Fatalf("the payload or output made %d elements", n)
		}
		if title := value(t, c, chromedp.Evaluate[string](`document.title`)); title == "pwned" {
			t.Fatal("the payload ran as markup")
		}
		c.open(t, "#/tasks?queue=kinds", row(plain.ID))
		c.run(t,
			chromedp.SetValue(chromedp.CSS("#f-kind"), "resize"),
			chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)),
		)
		c.poll(t, fmt.Sprintf(`document.querySelectorAll("#tasks tbody tr").length === 1 && document.querySelector(%q)?.textContent === "resize"`,
			row(task.ID)+` [data-role="kind"]`))
	})

	// The walk-through: a failed child of a canceled root is found
	// from the root's page, its error and its effects read, and it is
	// retried as a new task related to it.
	t.Run("RetryFailedChildOfCanceledRoot", func(t *testing.T) {
		hour := 3600.0
		root := schedule(t, c.acme, api.ScheduleRequest{Queue: "walk", Message: text("investigate the outage"), DelaySeconds: &hour})
		child := schedule(t, c.acme, api.ScheduleRequest{Queue: "walk-child", ParentID: root.ID, Message: text("check the load balancer")})
		claimed, ok, err := c.acme.ClaimNext(ctx, "walk-child", "w-walk", 10*time.Second)
		if err != nil || !ok || claimed.ID != child.ID {
			t.Fatalf("claim the child: %s %v %v", claimed.ID, ok, err)
		}
		if _, err := c.acme.RecordResult(ctx, child.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: false,
			Error: "the health check timed out", Effects: []events.Effect{{Kind: "pull_request", Ref: "acme/lb#7", URL: "https://example.com/acme/lb/pull/7"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.acme.Cancel(ctx, root.ID, "superseded by the incident review"); err != nil {
			t.Fatal(err)
		}
		c.open(t, "#/task/"+root.ID, fmt.Sprintf(`#tree a[href="#/task/%s"]`, child.ID))
		c.poll(t, `document.querySelector("h1 .status")?.dataset.status === "canceled"`)
		c.click(t, fmt.Sprintf(`#tree a[href="#/task/%s"]`, child.ID))
		c.poll(t, `document.querySelector("h1 .status")?.dataset.status === "failed" && document.querySelector("#result")?.textContent.includes("the health check timed out") && document.querySelector("#effects")?.textContent.includes("acme/lb#7")`)
		c.click(t, "#retry")
		c.poll(t, fmt.Sprintf(`location.hash.startsWith("#/task/") && location.hash !== "#/task/%s" && document.querySelector("h1 .status") !== null`, child.ID))
		newID := value(t, c, chromedp.Evaluate[string](`decodeURIComponent(location.hash.slice("#/task/".length))`))
		retried, err := c.acme.Get(ctx, newID)
		if err != nil || retried.RelatedTaskID != child.ID || retried.Queue != "walk-child" || retried.Message.Content[0].Text != "check the load balancer" {
			t.Fatalf("the retry %+v (%v), want a new task related to %s with its spec", retried, err, child.ID)
		}
	})

	t.Run("BulkRetry", func(t *testing.T) {
		task := schedule(t, c.acme, api.ScheduleRequest{Queue: "bulkretry", Message: text("retry me")})
		if _, err := c.acme.Cancel(ctx, task.ID, "to retry"); err != nil {
			t.Fatal(err)
		}
		c.open(t, "#/tasks?queue=bulkretry", row(task.ID)+` [data-status="canceled"]`)
		c.poll(t, fmt.Sprintf(`(() => { const b = document.querySelector(%q); if (!b) return false; if (!b.checked) b.click(); return b.checked })()`,
			row(task.ID)+` input[type="checkbox"]`))
		c.click(t, "#bulk-retry")
		c.poll(t, `document.querySelectorAll("#tasks tbody tr").length === 2`)
		l, err := c.acme.List(ctx, api.ListOptions{Queue: "bulkretry"})
		if err != nil || len(l.Tasks) != 2 {
			t.Fatalf("list %+v %v", l, err)
		}
		for _, got := range l.Tasks {
			if got.ID != task.ID && got.RelatedTaskID != task.ID {
				t.Fatalf("task %s on the queue is not the retry of %s: %+v", got.ID, task.ID, got)
			}
		}
	})

	t.Run("SearchByIDPrefix", func(t *testing.T) {
		prefix := live.ID[:20]
		want, err := c.acme.List(ctx, api.ListOptions{IDPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		all, err := c.acme.List(ctx, api.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(want.Tasks) == 0 || len(want.Tasks) >= len(all.Tasks) {
			t.Fatalf("prefix %q matches %d of %d tasks: no narrowing to see", prefix, len(want.Tasks), len(all.Tasks))
		}
		c.open(t, "#/tasks", "#f-idPrefix")
		c.run(t,
			chromedp.SetValue(chromedp.CSS("#f-idPrefix"), prefix),
			chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)),
		)
		c.poll(t, fmt.Sprintf(`location.hash === "#/tasks?idPrefix=%s" && document.querySelectorAll("#tasks tbody tr").length === %d && document.querySelector(%q) !== null`,
			prefix, len(want.Tasks), row(live.ID)))
	})

	t.Run("SchedulesPage", func(t *testing.T) {
		if _, _, err := c.acme.CreateSchedule(ctx, nightly); err != nil {
			t.Fatal(err)
		}
		sel := `tr[data-schedule="nightly"]`
		c.run(t, chromedp.Click(chromedp.CSS("#nav-schedules")), chromedp.WaitVisible(chromedp.CSS(sel+`[data-paused="false"]`)))
		c.poll(t, fmt.Sprintf(`document.querySelectorAll(%q).length === 5`, sel+" td:nth-child(5) li")) // the next instants
		// By keyboard: the focus stays on the row's action across redraws.
		c.poll(t, fmt.Sprintf(`(() => { const b = document.querySelector(%q); b?.focus(); return b !== null && document.activeElement === b })()`, sel+` button[data-action="pause"]`))
		c.run(t, chromedp.KeyEvent("\r"), chromedp.WaitVisible(chromedp.CSS(sel+`[data-paused="true"] button[data-action="resume"]`)))
		c.poll(t, fmt.Sprintf(`document.activeElement === document.querySelector(%q)`, sel+` button[data-action="resume"]`))
		if s, err := c.acme.GetSchedule(ctx, "nightly", api.ScheduleOptions{}); err != nil || !s.Paused {
			t.Fatalf("after Pause in the console: paused %v, %v", s.Paused, err)
		}
		c.click(t, sel+` button[data-action="trigger"]`)
		c.poll(t, fmt.Sprintf(`document.querySelector(%q) !== null`, sel+` li[data-task] a[href^="#/task/"]`))
		s, err := c.acme.GetSchedule(ctx, "nightly", api.ScheduleOptions{})
		if err != nil || len(s.Runs) != 1 || !s.Runs[0].Manual {
			t.Fatalf("after Trigger in the console: runs %+v, %v", s.Runs, err)
		}
		c.poll(t, fmt.Sprintf(`document.querySelector(%q) !== null`, sel+fmt.Sprintf(` li[data-task=%q] [data-status]`, s.Runs[0].TaskID)))
	})

	var holder, waiter api.Task
	t.Run("ConcurrencyPage", func(t *testing.T) {
		holder = schedule(t, c.acme, storefront("deploy the storefront"))
		waiter = schedule(t, c.acme, storefront("deploy it again"))
		c.open(t, "#/concurrency", `[data-page="concurrency"]`)
		key := fmt.Sprintf(`tr[data-key=%q]`, storefrontKey)
		c.poll(t, fmt.Sprintf(`!document.querySelector('[data-page="concurrency"]').textContent.includes("null") && document.querySelector(%q) !== null && document.querySelector(%q) !== null`,
			key+fmt.Sprintf(` li[data-role="holder"][data-task=%q] a[href="#/task/%s"]`, holder.ID, holder.ID),
			key+fmt.Sprintf(` li[data-role="waiter"][data-task=%q] a[href="#/task/%s"]`, waiter.ID, waiter.ID)))
		// Read inside the page: a live redraw may replace the row between
		// chromedp finding a node and reading it.
		c.poll(t, fmt.Sprintf(`document.querySelector(%q)?.textContent === "1"`, key+" td:nth-child(3)"))
	})

	t.Run("OverviewShowsLatenessAndLag", func(t *testing.T) {
		// The customer sees its own figures: no lag or alarm lateness,
		// which are every tenant's (GET /v1/stats leaves them out).
		c.open(t, "#/", `[data-page="overview"] [data-stat="claims"]`)
		c.poll(t, `document.querySelector('[data-stat="claims"] svg polyline') !== null &&
			document.querySelector('[data-stat="keys"] a[href="#/concurrency"]').textContent === "1" &&
			document.querySelector('[data-stat="schedules"] a[href="#/schedules"]').textContent === "1" &&
			document.querySelector('[data-stat="lateness"]') === null && document.querySelector('[data-stat="lag"]') === null`)
		c.login(t, operatorToken)
		c.open(t, "#/", `[data-page="overview"] [data-stat="lateness"]`)
		c.poll(t, `/ ms$/.test(document.querySelector('[data-stat="lateness"] b').textContent) &&
			/^[0-9]+$/.test(document.querySelector('[data-stat="lag"] b').textContent)`)
		c.login(t, acmeToken)
	})

	t.Run("EveryPageWithoutErrors", func(t *testing.T) {
		for _, p := range []struct{ hash, wait string }{
			{"#/", `[data-page="overview"] .cards`},
			{"#/tasks", row(live.ID)},
			{"#/task/" + waiter.ID, `#timeline [data-type="TaskScheduled"]`},
			{"#/schedules", `tr[data-schedule="nightly"]`},
			{"#/concurrency", `tr[data-key]`},
		} {
			c.open(t, p.hash, p.wait)
		}
		c.noErrors(t)
	})

	t.Run("Screenshots", func(t *testing.T) {
		c.login(t, acmeToken) // also when run alone (make screenshots)
		if _, _, err := c.acme.CreateSchedule(ctx, nightly); err != nil {
			t.Fatal(err)
		}
		if _, err := c.acme.TriggerSchedule(ctx, "nightly", api.ScheduleOptions{}); err != nil {
			t.Fatal(err)
		}
		schedule(t, c.acme, storefront("deploy the storefront"))
		schedule(t, c.acme, storefront("deploy it again"))
		root := schedule(t, c.acme, api.ScheduleRequest{Queue: "release", Message: text("review the storefront release")})
		child := schedule(t, c.acme, api.ScheduleRequest{ParentID: root.ID, Queue: "review", Message: text("run the checkout tests")})
		schedule(t, c.acme, api.ScheduleRequest{ParentID: root.ID, Queue: "review", Message: text("check the changelog")})
		claimed, ok, err := c.acme.ClaimNext(ctx, "review", "w2", time.Second)
		if err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
		for claimed.ID != child.ID { // claim in order until the child
			if _, err := c.acme.RecordResult(ctx, claimed.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true, Summary: "ok"}); err != nil {
				t.Fatal(err)
			}
			if claimed, _, err = c.acme.ClaimNext(ctx, "review", "w2", time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.acme.RecordResult(ctx, child.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Error: "checkout_test.go:88: timeout waiting for payment"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.acme.Cancel(ctx, root.ID, "release called off"); err != nil {
			t.Fatal(err)
		}
		dir := os.Getenv("TASKLEDGER_SCREENSHOTS")
		if dir == "" {
			dir = t.TempDir()
		}
		shots := []struct{ name, hash, wait string }{
			{"console-overview.png", "#/", `[data-page="overview"] table`},
			{"console-tasks.png", "#/tasks", row(child.ID)},
			{"console-task.png", "#/task/" + child.ID, `#tree li li[data-id="` + child.ID + `"] [data-status="failed"]`},
			{"console-schedules.png", "#/schedules", `tr[data-schedule="nightly"] li[data-task] [data-status]`},
			{"console-concurrency.png", "#/concurrency", `tr[data-key] li[data-role="holder"]`},
		}
		for _, s := range shots {
			c.open(t, s.hash, s.wait)
			value(t, c, chromedp.Evaluate[bool](`document.getElementById("toast").classList.remove("show") ?? true`))
			png := value(t, c, chromedp.CaptureScreenshot())
			if err := os.WriteFile(filepath.Join(dir, s.name), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("NoPageErrors", func(t *testing.T) { c.noErrors(t) })
}

// TestConsoleRefusesUnknownToken shows the login again, with a reason,
// for a token the server does not know.
func TestConsoleRefusesUnknownToken(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.run(t,
		chromedp.Navigate(c.url+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), "not-a-token"),
		chromedp.Click(chromedp.CSS(`form.login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`form.login [role="alert"]`)),
	)
	msg := value(t, c, chromedp.Text(chromedp.CSS(`form.login [role="alert"]`)))
	if !strings.Contains(msg, "not known") {
		t.Fatalf("login says %q", msg)
	}
	stored := value(t, c, chromedp.Evaluate[string](`sessionStorage.getItem("taskledger.token") || ""`))
	if stored != "" {
		t.Fatalf("an unknown token stayed in session storage: %q", stored)
	}
	c.noErrors(t)
}

// TestConsoleMalformedHash: a link whose hash holds a malformed percent
// escape (a stray "%", a cut UTF-8 sequence) shows the API's answer for
// that text as an error page, throws nothing, and the console goes on
// working: the next page is not covered by the error of the one before,
// which may come after it.
func TestConsoleMalformedHash(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.login(t, acmeToken)
	task := schedule(t, c.acme, api.ScheduleRequest{Message: text("after a bad link")})
	for _, hash := range []string{"#/task/%", "#/task/100%25%zz", "#/task/%E0%A4%A", "#/tasks?status=%zz&queue=%"} {
		c.run(t, chromedp.Navigate(c.url+"/ui/"+hash))
		c.poll(t, `document.querySelector('main [role="alert"]') !== null`) // the API's 400 or 404
	}
	c.open(t, "#/task/"+task.ID, `#timeline [data-type="TaskScheduled"]`)
	c.noErrors(t)
}

// TestConsoleStreamResumesAcrossRestart: the console's live stream,
// cut by a server restart, resumes after the last event it got: it
// receives every event of its customer exactly once, in order, also
// those stored while it was away.
// TestConsoleEpochs: for a log with epochs the overview shows each slot,
// its epoch and state.
func TestConsoleEpochs(t *testing.T) {
	t.Parallel()
	c := setup(t, func(cfg *node.Config) { cfg.EpochSlots, cfg.EpochPeriod = 3, time.Hour })
	c.login(t, operatorToken)
	c.run(t, chromedp.WaitVisible(chromedp.CSS(`#epochs tr[data-slot="2"][data-state="free"]`)))
	current := value(t, c, chromedp.Text(chromedp.CSS(`#epochs tr[data-slot="0"]`)))
	if epoch := c.node.Store.Epochs().Slots[0].Epoch; !strings.Contains(current, "open (current)") || !strings.Contains(current, strconv.FormatInt(epoch, 10)) {
		t.Fatalf("slot 0's row %q, want epoch %d open and current", current, epoch)
	}
	c.noErrors(t)
}

func TestConsoleStreamResumesAcrossRestart(t *testing.T) {
	t.Parallel()
	consoleStreamResumes(t, 1)
}

// On a log of three shards the stream's ids are tokens of three
// sequences (for a customer, sealed): the console resumes with its last
// one and gets every event once (the shards' events interleave, so not
// in one order).
func TestShardedConsoleStreamResumesAcrossRestart(t *testing.T) {
	t.Parallel()
	consoleStreamResumes(t, 3)
}

func consoleStreamResumes(t *testing.T, shards int) {
	c := setup(t, func(cfg *node.Config) { cfg.Shards = shards })
	ctx := context.Background()
	c.login(t, acmeToken)
	c.run(t,
		chromedp.WaitVisible(chromedp.CSS(`#live[data-state="live"]`)),
		// A customer's stream carries no log sequences: the events are
		// told apart by their ids, the resume token is opaque.
		chromedp.Evaluate[chromedp.Void](`window.seen = []; addEventListener("taskledger:event", (e) => seen.push(e.detail.id)); undefined`),
	)
	first := schedule(t, c.acme, api.ScheduleRequest{Message: text("before the restart")})
	schedule(t, c.operator, api.ScheduleRequest{CustomerID: "bob", Message: text("not acme's")})
	c.poll(t, "seen.length > 0")
	c.restart(t)
	if _, err := c.acme.Cancel(ctx, first.ID, "while the console was away"); err != nil {
		t.Fatal(err)
	}
	schedule(t, c.acme, api.ScheduleRequest{Message: text("after the restart")})
	var want []string
	if err := c.acme.CustomerEvents(ctx, "acme", time.Time{}, func(ev api.Event) error {
		want = append(want, ev.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if shards > 1 {
		c.poll(t, fmt.Sprintf("seen.length >= %d", len(want)))
		seen := value(t, c, chromedp.Evaluate[[]string]("seen"))
		slices.Sort(seen)
		slices.Sort(want)
		if !slices.Equal(seen, want) {
			t.Fatalf("the console got the events %v, want %v (every acme event, once)", seen, want)
		}
		c.noErrors(t)
		return
	}
	c.poll(t, fmt.Sprintf("seen.includes(%q)", want[len(want)-1]))
	seen := value(t, c, chromedp.Evaluate[[]string]("seen"))
	if i := slices.Index(want, seen[0]); i >= 0 {
		want = want[i:]
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("the console got the events %v, want %v (every acme event from the first it got, once)", seen, want)
	}
	if got := value(t, c, chromedp.Text(chromedp.CSS("#live"))); got != "live" {
		t.Fatalf("live state %q after the restart", got)
	}
	c.noErrors(t)
}
