package ops

import (
	"reflect"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Every reason envelope.Parse can give a new message names the request
// field it is about: a new reject code needs its field here, or a 400
// would name the body for a rule about another field.
func TestEveryRejectCodeNamesAField(t *testing.T) {
	// The codes a request cannot meet: its headers are made by Post, it is
	// never a control message, and it is in the delaybridge dialect.
	notFromARequest := map[envelope.Code]bool{
		envelope.CodeUndecodableHeaders: true, envelope.CodeInvalidCancel: true, envelope.CodeCancelUnknown: true,
		envelope.CodeInvalidEpoch: true, envelope.CodeInvalidScheduler: true,
		envelope.CodeMaxSeries: true, // the store's answer (store.OverSeries): a conflict, not a field
		envelope.CodeIDTaken:   true, // the store's answer (store.IDTaken): a conflict too
	}
	special := map[envelope.Code]bool{envelope.CodeOverMaxDelay: true, envelope.CodeInvalidRoute: true, envelope.CodeInvalidSchedule: true}
	for _, code := range envelope.RejectCodes {
		if notFromARequest[code] || special[code] {
			continue
		}
		if fieldOfCode[code] == "" {
			t.Errorf("reject code %q names no request field (fieldOfCode)", code)
		}
	}
	for _, c := range []struct {
		err   *envelope.Rejection
		hasAt bool
		want  string
	}{
		{&envelope.Rejection{Code: envelope.CodeOverMaxDelay}, true, "deliver_at"},
		{&envelope.Rejection{Code: envelope.CodeOverMaxDelay}, false, "delay"},
		{&envelope.Rejection{Code: envelope.CodeInvalidRoute, Reason: `sink "x" names no configured sink`}, false, "sink"},
		{&envelope.Rejection{Code: envelope.CodeInvalidRoute, Reason: `destination "a b" is not valid`}, false, "destination"},
		{&envelope.Rejection{Code: envelope.CodeInvalidSchedule, Reason: `x-delay-cron "x" is not valid`}, false, "cron"},
		{&envelope.Rejection{Code: envelope.CodeInvalidSchedule, Reason: `x-delay-count "0" is not a whole number`}, false, "count"},
		// A reason that names two options names the first of the table's.
		{&envelope.Rejection{Code: envelope.CodeInvalidSchedule, Reason: "x-delay-timezone applies to x-delay-cron only"}, false, "cron"},
		{&envelope.Rejection{Code: envelope.CodeInvalidSchedule, Reason: "x-delay-timezone, x-delay-until or x-delay-count given without x-delay-every or x-delay-cron"}, false, "every"},
		{&envelope.Rejection{Code: envelope.CodeInvalidSchedule, Reason: `x-delay-cron "CRON_TZ=UTC 0 9 * * *": "CRON_TZ=UTC 0 9 * * *" has a time zone prefix: give the zone in x-delay-timezone instead`}, false, "cron"},
	} {
		if got := rejectField(c.err, c.hasAt); got != c.want {
			t.Errorf("%s %q: field %q, want %q", c.err.Code, c.err.Reason, got, c.want)
		}
	}
}

// FieldNames renames each control header to its request field, the longer
// names first (x-delay is a prefix of most).
func TestFieldNames(t *testing.T) {
	for in, want := range map[string]string{
		`x-delay "soon" is neither`:                     `delay "soon" is neither`,
		"x-delay-every too short":                       "every too short",
		"x-deliver-at is empty":                         "deliver_at is empty",
		"both x-delay and x-deliver-at given":           "both delay and deliver_at given",
		"x-delay-timezone applies to x-delay-cron only": "timezone applies to cron only",
		"x-message-id is empty":                         "id is empty",
	} {
		if got := FieldNames(in); got != want {
			t.Errorf("FieldNames(%q) = %q, want %q", in, got, want)
		}
	}
}

// The reasons of a message that died for its destination are told from the
// others: such a message is retried only with a destination given.
func TestBrokerRefused(t *testing.T) {
	for reason, want := range map[string]bool{
		`publish failed 5 times, last: rabbitmq sink r: unroutable: exchange "" has no queue bound for routing key "q" (returned 312 NO_ROUTE)`: true,
		`publish failed 5 times, last: kafka sink k: topic "t" does not exist (create it; the message is retried): unknown topic`:               true,
		`sink "old" is not configured`: true,
		`publish failed 3 times, last: rabbitmq sink r: the broker closed the channel when the message was published to routing key "amq.rabbitmq.reply-to.x" on exchange "": Exception (541) Reason: "INTERNAL_ERROR"`: true,
		`destination "q" of sink n did not answer within scheduler.publish_timeout 5s (3 times in a row) while the sink confirmed other messages: context deadline exceeded`:                                            true,
		`late: due 2026-12-01T10:00:00Z, claimed 2026-12-01T10:05:00Z, more than scheduler.max_lateness 1m0s after (late_policy dead)`:                                                                                  false,
		`cannot decode the stored message: envelope: corrupt stored message`:                                                                                                                                            false,
		`cannot decode the stored message: envelope: seal: unknown key: sealed with key "k1", which is not configured (encryption.keys has ["k2"])`:                                                                     false,
		`cannot decode the stored message: envelope: sealed with key "k2", but encryption is not configured`:                                                                                                            false,
	} {
		if got := brokerRefused(reason); got != want {
			t.Errorf("brokerRefused(%q) = %v, want %v", reason, got, want)
		}
	}
}

// The document's enum of a recurrence's missed is route.missed's words, as
// envelope.Missed names them.
func TestMissedEnumIsTheEnvelopes(t *testing.T) {
	var names []string
	for m := envelope.MissedOnce; m <= envelope.MissedSkip; m++ {
		names = append(names, m.String())
	}
	f, _ := reflect.TypeFor[RecurrenceView]().FieldByName("Missed")
	if got, want := f.Tag.Get("enum"), strings.Join(names, ","); got != want {
		t.Errorf("RecurrenceView.Missed enum %q, want %q", got, want)
	}
}
