package httpapi

import "strings"

// RoutePatterns returns the http.ServeMux pattern of every route
// NewHandler registers, from the one routes table, as OpenAPI paths: the
// mux's "{$}" (exactly this path, not the subtree) is left off.
func RoutePatterns() []string {
	out := make([]string, len(routes))
	for i, rt := range routes {
		out[i] = strings.TrimSuffix(rt.pattern, "{$}")
	}
	return out
}
