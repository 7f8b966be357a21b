package admin

import (
	"net/http/httptest"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/ops/opstest"
)

// TestOperationsBothWays runs the same operations (pkg/ops/opstest's
// cases) through the Service on Redis, as the command line's -c mode does,
// and through this server with its Client, as its --admin mode and the
// dashboard do: same answers, same refusals, same sentences.
func TestOperationsBothWays(t *testing.T) {
	for _, way := range []opstest.Harness{
		{Name: "service", Open: func(t *testing.T, p ops.Params) ops.Operations { return ops.New(p) }},
		{Name: "http", Open: func(t *testing.T, p ops.Params) ops.Operations {
			ts := httptest.NewServer(New(Params{Ops: ops.New(p), Token: testToken}).Handler())
			t.Cleanup(ts.Close)
			return NewClient(ts.URL, testToken, ts.Client())
		}},
	} {
		t.Run(way.Name, func(t *testing.T) { opstest.Run(t, way) })
	}
}
