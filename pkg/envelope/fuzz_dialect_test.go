package envelope

import (
	"bytes"
	"strconv"
	"testing"
	"time"
)

// Bits of FuzzParseDialects' mask.
const (
	fdSched     = 1 << iota // the ingest reads kafka-scheduler
	fdDelay                 // ... and delaybridge
	fdEpoch                 // scheduler-epoch present
	fdTopic                 // scheduler-target-topic present
	fdTargetKey             // scheduler-target-key present
	fdXDelay                // x-delay: 1000 present
	fdTombstone             // a record without a value
	fdExtra                 // the extra header present
)

// FuzzParseDialects feeds Parse records in either dialect with destination
// templates in the route, and checks the invariants of checkDecision plus
// the dialect's own: a kafka-scheduler record parks under its key, replacing,
// with its target key and topic, without the dialect's control headers; a
// tombstone cancels its key; a parked destination is always valid.
func FuzzParseDialects(f *testing.F) {
	e := strconv.FormatInt(testNow.Add(time.Hour).Unix(), 10)
	ms := strconv.FormatInt(testNow.Add(time.Hour).UnixMilli(), 10)
	all := uint8(fdSched | fdEpoch | fdTopic | fdTargetKey)
	f.Add(all, "{source}", "schedules", e, "online-videos", "vid1", "vid1-online", "customer-header", "dummy", []byte("video 1"))
	f.Add(all|fdDelay, "{source}", "schedules", e, "online-videos", "vid1", "vid1-online", "", "", []byte("video 1"))
	f.Add(all, "x", "s", ms, "t", "", "k", "", "", []byte("x"))
	f.Add(all, "x", "s", "1893456000.5", "t", "", "k", "", "", []byte("x"))
	f.Add(all, "x", "s", "-1", "t", "", "k", "", "", []byte("x"))
	f.Add(all, "x", "s", "+99999999999999999999", "t", "", "k", "", "", []byte("x"))
	f.Add(all, "x", "s", e, "", "", "", "", "", []byte("x"))
	f.Add(uint8(fdSched|fdTombstone), "x", "s", "", "", "", "vid1-online", "", "", []byte(nil))
	f.Add(uint8(fdSched|fdDelay|fdTombstone|fdXDelay), "x", "s", "", "", "", "k", "", "", []byte(nil))
	f.Add(uint8(fdSched|fdTombstone), "x", "s", "", "", "", "", "", "", []byte(nil))
	f.Add(uint8(fdSched|fdEpoch|fdXDelay), "x", "s", e, "", "", "k", "", "", []byte("x"))
	f.Add(uint8(fdXDelay), "fired.{source.2:}", "delayed.orders.eu", "", "", "", "", "", "", []byte("x"))
	f.Add(uint8(fdXDelay), "{source.4}", "a.b", "", "", "", "", "", "", []byte("x"))
	f.Add(uint8(fdXDelay|fdExtra), "{header.tenant}.{source.1}", "orders.x", "", "", "", "", "tenant", "eu", []byte("x"))
	f.Add(uint8(fdXDelay|fdExtra), "{header.tenant}", "", "", "", "", "", "tenant", "a\x00b", []byte("x"))
	f.Add(uint8(fdXDelay), "{{{source}}}", "s", "", "", "", "", "", "", []byte("x"))
	f.Add(uint8(fdXDelay), "{source", "s", "", "", "", "", "", "", []byte("x"))

	f.Fuzz(func(t *testing.T, mask uint8, routeDest, source, epoch, topic, targetKey, key, k, v string, body []byte) {
		has := func(bit int) bool { return mask&uint8(bit) != 0 }
		in := &Incoming{Source: source, Body: body, Origin: Origin{Log: "schedules/0", Pos: 1}, PublishedAt: testNow.Add(-time.Second)}
		if key != "" {
			in.Key = []byte(key)
		}
		add := func(bit int, k, v string) {
			if has(bit) {
				in.Headers = append(in.Headers, Header{Key: k, Value: v})
			}
		}
		add(fdEpoch, HeaderSchedulerEpoch, epoch)
		add(fdTopic, HeaderSchedulerTargetTopic, topic)
		add(fdTargetKey, HeaderSchedulerTargetKey, targetKey)
		add(fdXDelay, HeaderDelay, "1000")
		add(fdExtra, k, v)
		if has(fdTombstone) {
			in.Body, in.Tombstone = nil, true
		}
		r := testRoute()
		r.Sink = "kafka"
		r.Destination = routeDest
		r.AllowOverride = true
		if has(fdSched) {
			r.Dialects = append(r.Dialects, DialectKafkaScheduler)
		}
		if has(fdDelay) {
			r.Dialects = append(r.Dialects, DialectDelaybridge)
		}
		newID, _ := genIDs()
		d := Parse(in, r, fuzzLimits, testNow, newID)
		checkDecision(t, in, fuzzLimits, testNow, d)

		// A kafka-scheduler record, as Parse should have classified it.
		_, hasEpoch := in.Headers.Get(HeaderSchedulerEpoch)
		hasXDelay := firstPresent(in.Headers, delaybridgeSignals) != ""
		sched := r.reads(DialectKafkaScheduler) && !hasXDelay &&
			(hasEpoch || in.Tombstone && key != "" || !r.reads(DialectDelaybridge) ||
				has(fdTopic) || has(fdTargetKey) || firstPresent(in.Headers, schedulerControl) != "")
		m := d.Message
		switch d.Action {
		case Park:
			if !sched {
				if m.Replace {
					t.Fatalf("a delaybridge message without x-delay-replace replaces")
				}
				return
			}
			if m.ID != key || !m.Replace {
				t.Fatalf("kafka-scheduler record parked as %q (key %q), replace %v", m.ID, key, m.Replace)
			}
			if tk, ok := in.Headers.Get(HeaderSchedulerTargetKey); ok && (m.Key == nil || !bytes.Equal(m.Key, []byte(tk))) || !ok && m.Key != nil {
				t.Fatalf("published key %q, scheduler-target-key %q", m.Key, tk)
			}
			if tt, ok := in.Headers.Get(HeaderSchedulerTargetTopic); ok && m.Destination != tt {
				t.Fatalf("destination %q, scheduler-target-topic %q", m.Destination, tt)
			}
			for _, h := range schedulerControl {
				if m.Headers.Count(h) != 0 {
					t.Fatalf("forwards %s", h)
				}
			}
			for _, h := range schedulerAdded {
				if m.Headers.Count(h) != 1 {
					t.Fatalf("%s %d times", h, m.Headers.Count(h))
				}
			}
			if sec, err := strconv.ParseInt(epoch, 10, 64); err != nil || !m.DueAt.Equal(time.Unix(sec, 0)) {
				t.Fatalf("due %v from scheduler-epoch %q", m.DueAt, epoch)
			}
		case Cancel:
			if d.Tombstone && (!in.Tombstone || d.CancelID != key || !r.reads(DialectKafkaScheduler)) {
				t.Fatalf("tombstone cancel of %q from key %q", d.CancelID, key)
			}
		case Reject:
			if m.Replace {
				t.Fatalf("a rejected message replaces")
			}
		}
	})
}
