package admin

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/delaybridge/delaybridge/pkg/metrics"
)

// OpenAPI returns the OpenAPI 3.0 document of the admin API: generated
// from the routes and their Go types (routes.go, handlers.go, pkg/ops), of
// a server with every route (metrics, pprof); served at GET /openapi.json
// without a token. openapi.json beside this file is a copy for readers and
// tools, kept equal to it by TestOpenAPIFileIsGenerated.
func OpenAPI() []byte {
	openAPIOnce.Do(func() { openAPIDoc = generateOpenAPI() })
	return openAPIDoc
}

var (
	openAPIOnce sync.Once
	openAPIDoc  []byte
)

func generateOpenAPI() []byte {
	s := New(Params{Listen: "127.0.0.1:0", Token: "-", Pprof: true, Metrics: metrics.New()})
	raw, err := s.api.OpenAPI().Downgrade() // 3.0 for the tools that read no 3.1 (kin-openapi)
	if err != nil {
		panic("admin: the OpenAPI document cannot be written: " + err.Error())
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		panic("admin: the OpenAPI document cannot be written: " + err.Error())
	}
	out.WriteByte('\n')
	return out.Bytes()
}

func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(OpenAPI())
}
