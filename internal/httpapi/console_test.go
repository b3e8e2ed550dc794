package httpapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/internal/console"
	"github.com/taskledger/taskledger/internal/node"
)

// consoleGet sends GET path with the given headers, following no
// redirect, and returns the answer.
func consoleGet(t *testing.T, b *bundle, method, path string, header map[string]string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(method, b.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawAnswer{status: res.StatusCode, header: res.Header, body: body}
}

// TestConsoleAssets checks how /ui/ serves the console: public even with
// an auth file, typed, under a strict CSP, revalidated by ETag, /ui
// redirected, unknown names 404, unclean paths 400.
func TestConsoleAssets(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Tokens = map[string]string{"secret": "acme"} })
	for path, want := range map[string]string{
		"/ui/":           "text/html; charset=utf-8",
		"/ui/index.html": "text/html; charset=utf-8",
		"/ui/app.js":     "text/javascript; charset=utf-8",
		"/ui/api.js":     "text/javascript; charset=utf-8",
		"/ui/style.css":  "text/css; charset=utf-8",
	} {
		a := consoleGet(t, b, http.MethodGet, path, nil)
		if a.status != http.StatusOK || a.header.Get("Content-Type") != want {
			t.Fatalf("GET %s: %d %q, want 200 %q", path, a.status, a.header.Get("Content-Type"), want)
		}
		if a.header.Get("Content-Security-Policy") != console.ContentSecurityPolicy || a.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("GET %s: headers %v", path, a.header)
		}
		if a.header.Get("Cache-Control") != "no-cache" || a.header.Get("ETag") == "" {
			t.Fatalf("GET %s: caching headers %v", path, a.header)
		}
		again := consoleGet(t, b, http.MethodGet, path, map[string]string{"If-None-Match": a.header.Get("ETag")})
		if again.status != http.StatusNotModified || len(again.body) != 0 {
			t.Fatalf("GET %s with its ETag: %d", path, again.status)
		}
		head := consoleGet(t, b, http.MethodHead, path, nil)
		if head.status != http.StatusOK || len(head.body) != 0 {
			t.Fatalf("HEAD %s: %d, %d bytes", path, head.status, len(head.body))
		}
	}
	index := consoleGet(t, b, http.MethodGet, "/ui/", nil)
	if strings.Contains(string(index.body), "<script>") || strings.Contains(string(index.body), "style=") {
		t.Fatal("index.html has inline script or style, which the CSP refuses")
	}
	t.Run("RedirectsBarePath", func(t *testing.T) {
		a := consoleGet(t, b, http.MethodGet, "/ui", nil)
		if a.status != http.StatusMovedPermanently || a.header.Get("Location") != "/ui/" {
			t.Fatalf("GET /ui: %d %q", a.status, a.header.Get("Location"))
		}
	})
	t.Run("UnknownAssetIs404", func(t *testing.T) {
		for _, p := range []string{"/ui/nope.js", "/ui/static/app.js", "/ui/console.go", "/ui/app.js/x"} {
			requireErrorBody(t, consoleGet(t, b, http.MethodGet, p, nil), http.StatusNotFound, "not_found")
		}
	})
	t.Run("UncleanPathIs400", func(t *testing.T) {
		requireErrorBody(t, rawExchange(t, b, []byte("GET /ui/../ui/app.js HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")), http.StatusBadRequest, "invalid_argument")
	})
	t.Run("OnlyGet", func(t *testing.T) {
		a := consoleGet(t, b, http.MethodPost, "/ui/", nil)
		if a.status != http.StatusMethodNotAllowed && a.status != http.StatusNotFound {
			t.Fatalf("POST /ui/: %d", a.status)
		}
	})
}

// TestConsoleLoopbackOnlyWithoutAuth: without an auth file the console,
// like the API, is served only for a loopback Host (DNS rebinding).
func TestConsoleLoopbackOnlyWithoutAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireErrorBody(t, consoleGet(t, b, http.MethodGet, "/ui/", map[string]string{"Host": "evil.example"}), http.StatusForbidden, "forbidden")
	if a := consoleGet(t, b, http.MethodGet, "/ui/", map[string]string{"Host": "localhost"}); a.status != http.StatusOK {
		t.Fatalf("GET /ui/ for localhost: %d", a.status)
	}
}
