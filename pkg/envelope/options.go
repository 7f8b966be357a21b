package envelope

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Options are the per-message options a publisher may set, one field
// each. This struct is their table; each field's tags say:
//
//   - header: the header of the delaybridge dialect that sets it (its
//     rule is in Parse; the header is a control header, never forwarded);
//   - json: the field of POST /v1/messages that sets it (ops.PostRequest
//     embeds Options), with the bounds its schema states (minimum,
//     maximum, for huma) and its doc;
//   - sealed: "true" when at-rest encryption seals it (codec.go);
//   - view: the field of a message's view that shows it (ops.MessageView,
//     a JSON path; none: the option is an instruction, not kept).
//
// The due time (delay, deliver_at), the route (sink, destination) and the
// content (key, headers, body) are the message itself, not options.
// Headers turns the options into the headers Parse reads; tests check the
// table against Parse, the API's schema, the views and docs/reference.md.
// A new option is a field here, its Message field and its rule in Parse,
// its tests and its line in docs/reference.md; one that is kept with the
// message needs its encoding (codec.go) and its view (ops/views.go) too.
type Options struct {
	ID       *string `json:"id,omitempty" nullable:"true" header:"x-message-id" view:"id" doc:"the message ID; generated when absent"`
	Priority *int    `json:"priority,omitempty" nullable:"true" minimum:"0" maximum:"9" header:"x-delay-priority" view:"priority" doc:"0 (default) to 9; higher fires first in a backlog"`
	Group    *string `json:"group,omitempty" nullable:"true" header:"x-delay-group" sealed:"true" view:"group" doc:"files the message under a group (x-delay-group)"`
	Replace  *bool   `json:"replace,omitempty" nullable:"true" header:"x-delay-replace" doc:"replace the message parked under this ID (x-delay-replace)"`
	Every    string  `json:"every,omitempty" header:"x-delay-every" sealed:"true" view:"recurrence.every" doc:"recurring: a Go duration of at least 1s (x-delay-every)"`
	Cron     string  `json:"cron,omitempty" header:"x-delay-cron" sealed:"true" view:"recurrence.cron" doc:"recurring: a 5- or 6-field cron expression or @hourly... (x-delay-cron)"`
	TimeZone string  `json:"timezone,omitempty" header:"x-delay-timezone" sealed:"true" view:"recurrence.timezone" doc:"the IANA zone of cron (x-delay-timezone); default UTC"`
	Until    string  `json:"until,omitempty" header:"x-delay-until" sealed:"true" view:"recurrence.until" doc:"recurring: no occurrence after this time, RFC 3339 (x-delay-until)"`
	Count    *int    `json:"count,omitempty" nullable:"true" minimum:"1" header:"x-delay-count" sealed:"true" view:"recurrence.count" doc:"recurring: at most this many occurrences (x-delay-count)"`
}

// Option is one row of the Options table.
type Option struct {
	Field  string // the API's field (json)
	Header string // the delaybridge dialect's header
	Sealed bool   // sealed at rest
	View   string // the view's field, a JSON path; "" none
}

// OptionTable returns the rows of Options, in its order.
func OptionTable() []Option { return slices.Clone(optionTable) }

var optionTable = func() []Option {
	t := reflect.TypeFor[Options]()
	out := make([]Option, t.NumField())
	for i := range out {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		out[i] = Option{Field: name, Header: f.Tag.Get("header"), Sealed: f.Tag.Get("sealed") == "true", View: f.Tag.Get("view")}
		if name == "" || out[i].Header == "" {
			panic(fmt.Sprintf("envelope.Options.%s: needs its json and header tags", f.Name))
		}
	}
	return out
}()

// Headers returns the options given (a nil pointer or an empty string is
// not given) as the headers of the delaybridge dialect, in the table's
// order.
func (o *Options) Headers() Headers {
	var hs Headers
	v := reflect.ValueOf(o).Elem()
	for i, opt := range optionTable {
		f := v.Field(i)
		if f.Kind() == reflect.Pointer {
			if f.IsNil() {
				continue
			}
			f = f.Elem()
		}
		var s string
		switch f.Kind() {
		case reflect.String:
			if f.String() == "" && v.Field(i).Kind() != reflect.Pointer {
				continue
			}
			s = f.String()
		case reflect.Int:
			s = strconv.FormatInt(f.Int(), 10)
		case reflect.Bool:
			s = strconv.FormatBool(f.Bool())
		default:
			panic("envelope.Options: a field of kind " + f.Kind().String())
		}
		hs = append(hs, Header{Key: opt.Header, Value: s})
	}
	return hs
}

// optionHeaders returns the header of each option, in the table's order.
func optionHeaders() []string {
	out := make([]string, len(optionTable))
	for i, o := range optionTable {
		out[i] = o.Header
	}
	return out
}

// OptionFields returns the API's field of each option, in the table's
// order.
func OptionFields() []string {
	out := make([]string, len(optionTable))
	for i, o := range optionTable {
		out[i] = o.Field
	}
	return out
}
