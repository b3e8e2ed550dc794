package main

import (
	"strings"
	"testing"
)

func TestServeRefusesBadDeliveryFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--delivery-budget", "0s"}, {"--delivery-retry-max", "-1s"}, {"--republish-after", "0s"}, {"--queue-idle", "0s"},
		{"--delivery-max-attempts", "-1"}, {"--max-polls-per-customer", "0"}, {"--max-queues-per-customer", "-2"},
		{"--delivery-budget", "soon"},
	} {
		code, stderr := serveOutput(t, nil, args...)
		if code != 2 || !strings.Contains(stderr, strings.TrimPrefix(args[0], "--")) {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant exit 2 naming the flag", args, code, stderr)
		}
	}
}
