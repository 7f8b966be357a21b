package admin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"

	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The /v1/ API is described by its Go types: huma (danielgtaylor/huma)
// registers each operation of the table (routes.go) with a handler taking
// a typed input (path and query parameters, a JSON body) and returning a
// typed output, and derives the OpenAPI document from those types (served
// at /openapi.json, see openapi.go). docs/api.md says why code-first, with
// the figures.
//
// huma only binds and describes here: what a request may be is checked by
// the operations (pkg/ops), so that the API and the command line refuse
// with the same sentences, and a request body is read by strictjson.Decode's
// rules, stricter than encoding/json. Every error answer is
// ErrorBody.

// ErrorBody is every error answer of the admin API.
type ErrorBody struct {
	Message string `json:"error" minLength:"1" doc:"Why, in words an operator can act on."`
	// Field names the request field or parameter of a 400.
	Field string `json:"field,omitempty" doc:"The request field or query parameter at fault (400)."`
	// DueAt is the message's due time, for the 409 of a reschedule whose
	// if_due_at no longer holds.
	DueAt string `json:"due_at,omitempty" doc:"With an if_due_at that no longer holds (409): the message's due time now."`
	// Code names a refusal a program may branch on, where it has one.
	Code string `json:"code,omitempty" doc:"The refusal's name, where it has one: too_deep (400: a body nested deeper than 64 levels)."`

	status  int
	headers http.Header // Retry-After of a 409 that passes
}

func (e *ErrorBody) Error() string  { return e.Message }
func (e *ErrorBody) GetStatus() int { return e.status }

// GetHeaders implements huma.HeadersError.
func (e *ErrorBody) GetHeaders() http.Header { return e.headers }

// ContentType implements huma.ContentTypeFilter: errors are
// application/json like every other answer.
func (e *ErrorBody) ContentType(string) string { return "application/json" }

func init() {
	// huma writes the errors it finds itself (an unparsable parameter, an
	// unreadable body) through NewError: as ErrorBody, with 400 for its 422.
	huma.NewError = newHumaError
	huma.NewErrorWithContext = func(hctx huma.Context, status int, msg string, errs ...error) huma.StatusError {
		e := newHumaError(status, msg, errs...)
		if rec, ok := hctx.Context().Value(recorderKey{}).(*recorder); ok {
			rec.errMsg = e.Error()
		}
		return e
	}
}

// maxEcho bounds what an error sentence huma wrote may quote of the
// request (the contract's 256 bytes).
const maxEcho = 256

// newHumaError is huma's error of binding a request, as an ErrorBody
// naming the field.
func newHumaError(status int, msg string, errs ...error) huma.StatusError {
	// huma's own sentences may hold a request's input whole (a
	// Content-Type it does not know): at most maxEcho bytes of them.
	e := &ErrorBody{status: status, Message: jsonlimit.Clip(msg, maxEcho)}
	if status == http.StatusUnprocessableEntity {
		e.status = http.StatusBadRequest
	}
	for _, err := range errs {
		var d *huma.ErrorDetail
		if !errors.As(err, &d) {
			if err != nil {
				e.Message = jsonlimit.Clip(err.Error(), maxEcho)
			}
			continue
		}
		e.Field, e.Message = detailSentence(d)
		if code, _, ok := strings.Cut(e.Message, ": "); ok && code == jsonlimit.Code {
			e.Code = code
		}
		break // the first is enough to act on
	}
	switch {
	case status == http.StatusRequestEntityTooLarge:
		e.Message = tooLarge(msg)
	case msg == "request body is required":
		e.Message = "empty request body: send a JSON object"
	}
	return e
}

// tooLarge is the 413 of huma's message for a body that reached its bound
// (maxBody: the limit + 1).
func tooLarge(msg string) string {
	bound, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(msg, "request body is too large limit="), " bytes"), 10, 64)
	switch {
	case err != nil:
		return msg
	case bound-1 == maxSmallBody:
		return fmt.Sprintf("request body over %d bytes: this request takes a few short fields", maxSmallBody)
	}
	return fmt.Sprintf("request body over %d bytes; the message body may be at most limits.max_payload_bytes", bound-1)
}

// detailSentence is what huma found wrong with a parameter or the body, in
// the words of the other refusals: the field and the reason.
func detailSentence(d *huma.ErrorDetail) (field, reason string) {
	where, name, _ := strings.Cut(d.Location, ".")
	switch where {
	case "body":
		return name, d.Message // strictjson's reason names the field itself
	case "query", "path":
		name, value := clipped(name), clipped(fmt.Sprint(d.Value))
		switch d.Message {
		case "invalid integer":
			return name, fmt.Sprintf("%s=%q is not an integer", name, value)
		case "invalid boolean":
			return name, fmt.Sprintf("%s=%q is not a boolean; use %s=true", name, value, name)
		}
		return name, fmt.Sprintf("%s parameter %s=%q: %s", where, name, value, d.Message)
	}
	return "", d.Message
}

// failure is an operation's error as its answer: 404, 409, 400 and 503 for
// the kinds of ops.Error with its sentence, 503 when this daemon cannot
// reach Redis or Redis refuses for a moment (store.Passing: look again,
// and retry), 500 for anything else (Redis answered an error). It is the one mapping of errors to statuses; the
// reason goes to the request log too.
func failure(ctx context.Context, err error) error {
	e := &ErrorBody{status: http.StatusInternalServerError, Message: err.Error()}
	if store.Unreachable(err) && ctx.Err() == nil {
		// Whether a change was made cannot be told: go-redis retries a
		// command whose connection broke (the last error, a dial, is the
		// one returned), and an operation over several shards stops at the
		// first that fails.
		e.status = http.StatusServiceUnavailable
		e.Message = fmt.Sprintf("Redis cannot be reached from this daemon (%v): a change asked for may or may not have been made; "+
			"once GET /readyz answers 200, look again and retry (is Redis up, and the configured Redis address right?)", err)
		e.headers = http.Header{"Retry-After": {"1"}}
	}
	if errors.Is(err, store.ErrLayoutUnknown) {
		e.status = http.StatusServiceUnavailable // until the layout is one this build knows
	}
	if store.Passing(err) && ctx.Err() == nil {
		e.status = http.StatusServiceUnavailable
		e.Message = fmt.Sprintf("Redis refused the command, as it does for a moment during a failover or while a slot moves (%v): "+
			"it was not made, or, over several shards, made on some; look again and retry (if it lasts, is the Redis address a master's?)", err)
		e.headers = http.Header{"Retry-After": {"1"}}
	}
	var oe *ops.Error
	if errors.As(err, &oe) {
		e.Message, e.Field, e.DueAt = oe.Reason, oe.Field, oe.DueAt
		if oe.RetryAfter > 0 {
			e.headers = http.Header{"Retry-After": {strconv.Itoa(int(math.Ceil(oe.RetryAfter.Seconds())))}}
		}
		switch {
		case errors.Is(oe, ops.ErrNotFound):
			e.status = http.StatusNotFound
		case errors.Is(oe, ops.ErrConflict):
			e.status = http.StatusConflict
		case errors.Is(oe, ops.ErrInvalid):
			e.status = http.StatusBadRequest
		case errors.Is(oe, ops.ErrUnavailable):
			e.status = http.StatusServiceUnavailable
		}
	}
	var pe *ErrorBody // refused by the API itself (403 without a token)
	if errors.As(err, &pe) {
		e = pe
	}
	if rec, ok := ctx.Value(recorderKey{}).(*recorder); ok {
		rec.errMsg = e.Message
	}
	return e
}

type recorderKey struct{}

// body is an answer that is a JSON body.
type body[T any] struct{ Body T }

// answer returns v as the answer, or the operation's error.
func answer[T any](ctx context.Context, v *T, err error) (*body[T], error) {
	if err != nil {
		return nil, failure(ctx, err)
	}
	return &body[T]{Body: *v}, nil
}

// done is the empty answer (204) of an action, or its error.
func done(ctx context.Context, err error) (*struct{}, error) {
	if err != nil {
		return nil, failure(ctx, err)
	}
	return &struct{}{}, nil
}

// newAPI returns the huma API of the server on its router: JSON in and out
// with strictjson's rules and EncodeJSON, no documentation routes of its own
// (openapi.go serves the document).
func (s *Server) newAPI() huma.API {
	cfg := huma.DefaultConfig("delaybridge admin API", "1")
	cfg.OpenAPIPath, cfg.DocsPath, cfg.SchemasPath = "", "", ""
	cfg.CreateHooks = nil // no $schema links in answers
	cfg.Info.Description = apiDescription
	cfg.Components.SecuritySchemes = map[string]*huma.SecurityScheme{
		"bearer": {Type: "http", Scheme: "bearer", Description: "admin.token, as `Authorization: Bearer <token>`."},
	}
	cfg.Security = []map[string][]string{{"bearer": {}}}
	cfg.Formats = map[string]huma.Format{"application/json": {Marshal: marshalJSON, Unmarshal: func(data []byte, v any) error {
		return s.decodes.decode(len(data), func() error { return unmarshalJSON(data, v) })
	}}}
	cfg.Components.Schemas.RegisterTypeAlias(reflect.TypeFor[ops.Scalar](), reflect.TypeFor[scalarSchema]())
	return humago.New(s.router, cfg)
}

// scalarSchema is the schema of an ops.Scalar: an integer or a string.
type scalarSchema struct{}

func (scalarSchema) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{AnyOf: []*huma.Schema{{Type: "integer", Nullable: true}, {Type: "string"}},
		Description: "An integer or a string; null is absent."}
}

// apiDescription is the document's description: what every operation
// shares.
const apiDescription = `The admin HTTP API of delaybridge, on admin.listen (HTTPS with admin.tls).

- When admin.token is set, every /v1/ and /debug/ request needs ` + "`Authorization: Bearer <token>`" + ` (401 otherwise); /healthz, /readyz, /metrics, /openapi.json and the dashboard's page never do (the page then asks for the token, or takes it from the fragment of the link that opened it: /#token=<token>).
- Every answer is JSON except /metrics, the dashboard, pprof and the empty 204s; every error is ` + "`{\"error\": \"<reason>\"}`" + ` with Content-Type application/json, and a 400 names the field at fault in ` + "`field`" + `.
- Every request must name an allowed Host (admin.allowed_hosts; on loopback by default localhost, 127.0.0.1, ::1), else 403. A state-changing request (POST, PATCH, DELETE) from a page of another origin is 403, and one with a body that is not Content-Type: application/json is 415.
- JSON bodies are read strictly: exact field names, no unknown field, no key twice, valid UTF-8 without lone surrogates, one object. An unknown or repeated query parameter is refused.
- IDs and group keys in paths are URL-encoded (orders%2F3%2F1234); unencoded slashes, "//" and dot segments reach the handler as they are. A trailing /fire (POST only), /retry, /pause or /resume names the action: an ID that itself ends so has that slash encoded.
- Every GET also answers HEAD. A method a path does not have answers 405 with Allow and a JSON error; an unknown path 404 with a JSON error.

This document is generated from the server's Go types (pkg/admin, pkg/ops).`

// register adds one operation of the table to the API with its handler:
// its statuses (its own, those of its path parameter and of the guards in
// front of it) documented with ErrorBody, and recorded for Routes.
func register[I, O any](s *Server, api huma.API, o op, h func(context.Context, *I) (*O, error)) {
	hop := o.operation(s)
	if f, ok := reflect.TypeFor[O]().FieldByName("Body"); ok {
		for _, st := range o.bodyOn {
			hop.Responses[strconv.Itoa(st)] = &huma.Response{Description: statusMeaning(st),
				Content: map[string]*huma.MediaType{"application/json": {Schema: api.OpenAPI().Components.Schemas.Schema(f.Type, true, "")}}}
		}
	}
	huma.Register(api, hop, h)
	var query []string
	for _, p := range registered(api, o).Parameters {
		if p.In == "query" {
			query = append(query, p.Name)
		}
	}
	s.router.setQuery(o.method, o.path, query)
	s.routes = append(s.routes, o.route(query))
}

// registered returns the operation as the document has it.
func registered(api huma.API, o op) *huma.Operation {
	item := api.OpenAPI().Paths[o.path]
	if item == nil {
		panic("admin: " + o.path + " is not registered")
	}
	got := map[string]*huma.Operation{get: item.Get, post: item.Post, patch: item.Patch, del: item.Delete}[o.method]
	if got == nil {
		panic("admin: " + o.method + " " + o.path + " is not registered")
	}
	return got
}

// statuses are every status the operation answers.
func (o op) statuses() []int {
	st := append([]int{o.status}, o.errors...)
	st = append(st, http.StatusForbidden) // the Host guard
	if !o.raw && slices.Contains(o.errors, failed) {
		st = append(st, http.StatusServiceUnavailable) // Redis cannot be reached (failure)
	}
	if strings.HasPrefix(o.path, "/v1/") || strings.HasPrefix(o.path, "/debug/") {
		st = append(st, http.StatusUnauthorized)
	}
	if !safeMethod(&http.Request{Method: o.method}) {
		st = append(st, http.StatusUnsupportedMediaType) // and 403 cross-origin
	}
	if !o.raw {
		for _, m := range pathParam.FindAllStringSubmatch(o.path, -1) {
			st = append(st, paramStatuses[m[1]]...)
		}
	}
	slices.Sort(st)
	return slices.Compact(st)
}

var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// route is the operation as Routes reports it.
func (o op) route(query []string) Route {
	return Route{Method: o.method, Path: o.path, Query: slices.Clone(query), Statuses: o.statuses()}
}

// operation is the huma operation of o: its success answer comes from the
// handler's output type, every error answer is ErrorBody.
func (o op) operation(s *Server) huma.Operation {
	hop := huma.Operation{
		OperationID: o.id, Method: o.method, Path: o.path, Summary: o.summary, Description: o.desc,
		Tags: []string{o.tag}, DefaultStatus: o.status,
		// The operations check what a request may be (pkg/ops): huma
		// binds and describes.
		SkipValidateParams: true, SkipValidateBody: true,
		MaxBodyBytes: o.maxBody(s),
		Responses:    map[string]*huma.Response{},
	}
	if !o.secured() {
		hop.Security = o.security()
	}
	errSchema := errorSchema(s.api)
	for _, st := range o.statuses() {
		if st == o.status {
			continue
		}
		hop.Responses[strconv.Itoa(st)] = &huma.Response{Description: statusMeaning(st),
			Content: map[string]*huma.MediaType{"application/json": {Schema: errSchema}}}
	}
	return hop
}

// secured reports whether the operation needs the token.
func (o op) secured() bool {
	return strings.HasPrefix(o.path, "/v1/") || strings.HasPrefix(o.path, "/debug/")
}

// security is the requirement of an operation that does not need the
// token: none, or optional (/readyz says more to a caller with it).
func (o op) security() []map[string][]string {
	if o.tokenOptional {
		return []map[string][]string{{}, {"bearer": {}}}
	}
	return []map[string][]string{}
}

// maxBody bounds the operation's request body (0: huma's default): one
// byte over the limit, since huma refuses a body that fills its bound, and
// a body of the limit itself is allowed.
func (o op) maxBody(s *Server) int64 {
	switch o.body {
	case bodyMessage:
		return s.ops.Limits().MaxDocumentBytes() + 1
	case bodySmall:
		return maxSmallBody + 1
	}
	return 0
}

// maxSmallBody bounds a body of a few short fields (PATCH, a retry).
const maxSmallBody = 64 << 10

// errorSchema is the schema of ErrorBody.
func errorSchema(api huma.API) *huma.Schema {
	return api.OpenAPI().Components.Schemas.Schema(reflect.TypeFor[ErrorBody](), true, "Error")
}

// statusMeaning describes an error status in the document.
func statusMeaning(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "The request is invalid: the reason says which part and why, field names it."
	case http.StatusUnauthorized:
		return "admin.token is set and the request has no bearer token, or another one."
	case http.StatusForbidden:
		return "The Host is not one this server answers to (admin.allowed_hosts), a state-changing request came from a page of another origin, or content was asked for without admin.token."
	case http.StatusNotFound:
		return "Not found: the reason says what."
	case http.StatusConflict:
		return "Refused because of the state of what it acts on: the reason says why."
	case http.StatusRequestEntityTooLarge:
		return "The request body is too large."
	case http.StatusUnsupportedMediaType:
		return "A body that is not Content-Type: application/json."
	case http.StatusInternalServerError:
		return "Redis answered an error."
	case http.StatusServiceUnavailable:
		return "Not done now, and why: not ready, Redis cannot be reached, or a limit is reached; Retry-After says when to try again."
	}
	return http.StatusText(status)
}
