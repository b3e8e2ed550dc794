package httpapi_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskledger/taskledger/internal/httpapi"
)

// TestMetricsHandlerHostCheck: the metrics listener (serve
// --metrics-http), which has no token, serves a scraper that names it
// by address, localhost or a name it was given, and refuses every other
// Host before any route runs, as the API without an auth file does: a
// DNS-rebinding page would otherwise read every tenant's queue names.
func TestMetricsHandlerHostCheck(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "taskledger_secret_queue_gauge", Help: "a tenant's queue"}))
	h := httpapi.MetricsHandler(reg, []string{"Scraper.Internal"})
	get := func(host, path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	for _, host := range []string{"localhost", "LOCALHOST:9090", "127.0.0.1:9090", "[::1]:9090", "10.0.0.5:9090", "192.168.1.20", "[fd00::1]:9090",
		"scraper.internal:9090", "SCRAPER.internal"} {
		w := get(host, "/metrics")
		if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte("taskledger_secret_queue_gauge")) {
			t.Errorf("Host %s: %d, want 200 with the metrics", host, w.Code)
		}
		if w.Header().Get("X-Content-Type-Options") != "nosniff" || w.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("Host %s: headers %v", host, w.Header())
		}
	}
	for _, host := range []string{"evil.example", "evil.example:9090", "scraper.internal.evil.example", "localhost.evil.example", "10.0.0.5.nip.io", ""} {
		for _, path := range []string{"/metrics", "/v1/tasks"} {
			w := get(host, path)
			if w.Code != http.StatusForbidden || !bytes.Contains(w.Body.Bytes(), []byte(`"forbidden"`)) ||
				!bytes.Contains(w.Body.Bytes(), []byte("DNS rebinding")) || bytes.Contains(w.Body.Bytes(), []byte("secret")) {
				t.Errorf("Host %q %s: %d %s, want 403 saying why", host, path, w.Code, w.Body)
			}
		}
	}
	if w := get("10.0.0.5", "/v1/tasks"); w.Code != http.StatusNotFound {
		t.Errorf("an allowed Host, another path: %d, want 404", w.Code)
	}
}

// TestAnswersAreNotSniffedOrStored: every API answer, success or error,
// authenticated or not, says nosniff and no-store; the console's assets
// keep their own caching (revalidated, with an ETag).
func TestAnswersAreNotSniffedOrStored(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	for _, tc := range []struct{ auth, method, path, body string }{
		{"Bearer tok-a", http.MethodGet, "/v1/tasks", ""},
		{"Bearer tok-a", http.MethodPost, "/v1/tasks", `{"queue":"q"}`},
		{"Bearer tok-a", http.MethodGet, "/v1/tasks/NOSUCHTASK", ""},
		{"Bearer tok-a", http.MethodGet, "/v1/stats", ""},
		{"", http.MethodGet, "/v1/tasks", ""},
		{"", http.MethodGet, "/healthz", ""},
		{"", http.MethodGet, "/readyz", ""},
		{"Bearer tok-op", http.MethodGet, "/metrics", ""},
		{"", http.MethodGet, "/nowhere", ""},
	} {
		a := authDo(t, b, tc.auth, tc.method, tc.path, tc.body)
		if a.header.Get("X-Content-Type-Options") != "nosniff" || a.header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s: %d, headers %v; want nosniff and no-store", tc.method, tc.path, a.status, a.header)
		}
	}
	ui := consoleGet(t, b, http.MethodGet, "/ui/", nil)
	if ui.status != http.StatusOK || ui.header.Get("Cache-Control") != "no-cache" || ui.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("console: %d %v", ui.status, ui.header)
	}
}
