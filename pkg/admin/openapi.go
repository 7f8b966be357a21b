package admin

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3 description of this server (openapi.json beside
// this file), served at GET /openapi.json without a token. It is only
// bytes here: openapi_test.go reads it with kin-openapi, checks it against
// Routes both ways and validates real requests and answers against it.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3 document of the admin API.
func OpenAPI() []byte { return openAPI }

func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(openAPI)
}
