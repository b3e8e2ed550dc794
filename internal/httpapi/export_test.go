package httpapi

// RoutePatterns returns the http.ServeMux pattern of every route
// NewHandler registers, from the one routes table.
func RoutePatterns() []string {
	out := make([]string, len(routes))
	for i, rt := range routes {
		out[i] = rt.pattern
	}
	return out
}
