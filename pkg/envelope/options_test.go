package envelope

import (
	"bytes"
	"slices"
	"testing"
	"time"
)

// The options table's headers are the contract's per-message headers, in
// the table's order, and each is a control header (never forwarded).
func TestOptionTableHeaders(t *testing.T) {
	want := []string{HeaderMessageID, HeaderPriority, HeaderGroup, HeaderReplace, HeaderEvery, HeaderCron,
		HeaderTimeZone, HeaderUntil, HeaderCount}
	if got := optionHeaders(); !slices.Equal(got, want) {
		t.Errorf("the options' headers %q, want %q", got, want)
	}
	for _, o := range OptionTable() {
		if !IsControlHeader(o.Header) {
			t.Errorf("option %s: %s is not a control header", o.Field, o.Header)
		}
	}
}

// What Headers makes of every option, Parse reads back into the message:
// the table and Parse agree on each option's header and value.
func TestOptionsParseBack(t *testing.T) {
	str := func(s string) *string { return &s }
	num := func(n int) *int { return &n }
	yes := true
	until := testNow.Add(48 * time.Hour).Truncate(time.Second)
	parse := func(o Options) *Message {
		t.Helper()
		in := &Incoming{Headers: append(hdrs(HeaderDelay, "1h"), o.Headers()...), Body: []byte("b")}
		d := Parse(in, testRoute(), Limits{}, testNow, func() string { return "gen" })
		if d.Action != Park {
			t.Fatalf("%+v: %v", o.Headers(), d.Err)
		}
		return d.Message
	}
	m := parse(Options{ID: str("opt-1"), Priority: num(7), Group: str("grp-1"), Replace: &yes,
		Every: "30m", Until: until.Format(time.RFC3339), Count: num(5)})
	if m.ID != "opt-1" || m.Priority != 7 || m.Group != "grp-1" || !m.Replace || m.Recur == nil ||
		m.Recur.Every != 30*time.Minute || !m.Recur.Until.Equal(until) || m.Recur.Count != 5 {
		t.Errorf("every option but cron: %+v, recurrence %+v", m, m.Recur)
	}
	m = parse(Options{Cron: "0 9 * * MON", TimeZone: "Europe/Berlin"})
	if m.Recur == nil || m.Recur.Cron != "0 9 * * MON" || m.Recur.TimeZone != "Europe/Berlin" {
		t.Errorf("cron and timezone: %+v", m.Recur)
	}
	// Options not given make no header; a pointer to the zero value is
	// given.
	if hs := (&Options{}).Headers(); len(hs) != 0 {
		t.Errorf("no option given: headers %v", hs)
	}
	if hs := (&Options{Group: str(""), Priority: num(0)}).Headers(); len(hs) != 2 {
		t.Errorf("an empty group and priority 0 given: headers %v, want both", hs)
	}
}

// The options marked sealed are not in clear in a sealed message, and the
// others (what routes and orders a message) are where they can be read.
func TestOptionsSealedAsMarked(t *testing.T) {
	m := fullMessage()
	m.Group = "GROUP-OPTION-SECRET"
	m.Recur = &Recurrence{Cron: "17 9 * * MON", TimeZone: "Europe/Berlin", Anchor: m.DueAt, N: 1,
		Until: m.DueAt.Add(1000 * time.Hour), Count: 9}
	enc := sealK1.Encode(nil, m)
	for _, o := range OptionTable() {
		var in string
		switch o.Field {
		case "group":
			in = m.Group
		case "cron":
			in = m.Recur.Cron
		case "timezone":
			in = m.Recur.TimeZone
		default:
			continue // not text in the encoding, or the key it is stored under (id)
		}
		if clear := bytes.Contains(enc, []byte(in)); clear == o.Sealed {
			t.Errorf("option %s (sealed %v): in clear %v in a sealed message", o.Field, o.Sealed, clear)
		}
	}
}
