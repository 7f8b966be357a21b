//go:build bench

package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// runRawJetStream is the ceiling of one JetStream hop on this machine: n
// messages published with PublishAsync into a stream and consumed by a
// durable pull consumer with explicit acks (the settings of the daemon's own
// ingest consumer: MaxAckPending 1000, pulls of 500), no delay stage.
// Lateness here is latency: consume time minus the stream's timestamp.
func (e *env) runRawJetStream(t *testing.T, n int) *Scenario {
	s := &Scenario{Pairing: "NATS -> NATS", System: "raw JetStream", Load: natsLoad{kind: "max", n: n}.name(), Kind: "max",
		Messages: n, Delay: "none (latency)", BodyBytes: *flagBody}
	s.Load = "max rate, " + humanCount(float64(n)) + " msgs, no delay"
	t.Logf("== %s %s: %s", s.Pairing, s.System, s.Load)
	ctx := context.Background()
	_, js := e.connect(t, "bench raw publisher")
	_, jsc := e.connect(t, "bench raw consumer")
	stream := freshStream(t, js, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage})
	defer func() { _ = js.DeleteStream(ctx, "RAW") }()
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000,
	}); err != nil {
		t.Fatal(err)
	}
	cons, err := jsc.Consumer(ctx, "RAW", "raw")
	if err != nil {
		t.Fatal(err)
	}
	prefix := nextPrefix("raw")
	rec := newRecorder(n, prefix)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		md, err := m.Metadata()
		if err != nil {
			return
		}
		_ = m.Ack()
		rec.record(m.Headers().Get("x-message-id"), now, md.Timestamp)
	}, jetstream.PullMaxMessages(500))
	if err != nil {
		t.Fatal(err)
	}
	cpu := startCPU(0, e.rdb)
	body := make([]byte, *flagBody)
	pr := publish(t, js, n, 0, func(i int) *nats.Msg {
		m := &nats.Msg{Subject: "raw.bench", Data: body, Header: nats.Header{}}
		m.Header["x-message-id"] = []string{msgID(prefix, i)}
		return m
	})
	all := rec.wait(30*time.Second, 5*time.Minute)
	cpu.stop(s)
	cc.Stop()
	rec.fill(s)
	s.PublishErrors = pr.errs
	s.setPublish(pr)
	s.setEndToEnd(pr.first, rec)
	s.finish(all)
	return s
}

// runNativeSchedules runs the same load through NATS's own message
// schedules (nats-server 2.12+): each message is published to its own
// subject sched.<i> of a stream with AllowMsgSchedules, with
//
//	Nats-Schedule: @at <RFC 3339 due time>
//	Nats-Schedule-Target: schedout.bench
//
// (a schedule is per subject: a second schedule on the same subject
// replaces the first, so every delayed message needs a subject of its own).
// When due, the server stores a copy on the target subject, in the same
// stream; lateness is that copy's stream timestamp minus the due time.
func (e *env) runNativeSchedules(t *testing.T, l natsLoad) *Scenario {
	s := &Scenario{Pairing: "NATS -> NATS", System: "NATS schedules", Group: l.group, Load: l.name(), Kind: l.kind,
		Messages: l.n, TargetRate: l.rate, Delay: l.delay.String(), BodyBytes: *flagBody}
	if l.kind == "burst" {
		s.Delay = fmt.Sprintf("all due at +%s", l.lead)
	}
	t.Logf("== %s %s: %s", s.Pairing, s.System, s.Load)
	ctx := context.Background()
	_, js := e.connect(t, "bench schedule publisher")
	_, jsc := e.connect(t, "bench schedule consumer")
	freshStream(t, js, jetstream.StreamConfig{Name: "SCHED", Subjects: []string{"sched.>", "schedout.>"},
		Storage: jetstream.FileStorage, AllowMsgSchedules: true, AllowRollup: true})
	defer func() { _ = js.DeleteStream(ctx, "SCHED") }()
	prefix := nextPrefix(l.kind)
	rec := newRecorder(l.n, prefix)
	cc := consumeFired(t, jsc, "SCHED", "schedout.>", rec, func(h nats.Header) (time.Time, bool) {
		d, err := time.Parse(time.RFC3339Nano, h.Get("x-bench-due"))
		return d, err == nil
	})
	cpu := startCPU(0, e.rdb)
	body := make([]byte, *flagBody)
	burstAt := time.Now().Add(l.lead).Truncate(time.Millisecond)
	drainCPU := func() *DrainCPU { return nil }
	if l.kind == "burst" {
		drainCPU = cpuFrom(burstAt, 0, e.rdb)
	}
	pr := publish(t, js, l.n, l.rate, func(i int) *nats.Msg {
		due := time.Now().Add(l.delay).UTC().Truncate(time.Millisecond).Format(time.RFC3339Nano)
		if l.kind == "burst" {
			due = burstAt.UTC().Format(time.RFC3339Nano)
		}
		m := &nats.Msg{Subject: "sched." + strconv.Itoa(i), Data: body, Header: nats.Header{}}
		m.Header["Nats-Schedule"] = []string{"@at " + due}
		m.Header["Nats-Schedule-Target"] = []string{"schedout.bench"}
		m.Header["x-message-id"] = []string{msgID(prefix, i)}
		m.Header["x-bench-due"] = []string{due}
		return m
	})
	all := rec.wait(30*time.Second+l.lead, time.Duration(l.n/500)*time.Second+2*time.Minute+l.lead)
	dcpu := drainCPU()
	cpu.stop(s)
	cc.Stop()
	rec.fill(s)
	s.PublishErrors = pr.errs
	s.setPublish(pr)
	s.setEndToEnd(pr.first, rec)
	if l.kind == "burst" {
		s.setBurst(pr.first, burstAt, 0, pr.last, rec, nil, nil)
		s.Burst.CPU = dcpu
	}
	s.finish(all)
	return s
}

// runPublishFloor is the floor of the sink side of a same-instant burst on
// this machine: the n messages the daemon publishes at T (its sink's
// headers, envelope.Message.OutHeaders and Nats-Msg-Id, the same body and
// subject), built beforehand and published with PublishMsgAsync (16384 in
// flight) as fast as possible to the same sink
// stream (FIRED, file storage) from T = the first publish, and measured as
// the daemon's drain: n / (last stored - T) from the stream's timestamps.
func (e *env) runPublishFloor(t *testing.T, l natsLoad) *Scenario {
	s := &Scenario{Pairing: "NATS -> NATS", System: floorSystem, Group: l.group, Load: l.name(), Kind: l.kind,
		Messages: l.n, Delay: "none: published from T", BodyBytes: *flagBody}
	t.Logf("== %s %s: %s", s.Pairing, s.System, s.Load)
	ctx := context.Background()
	_, js := e.connectPending(t, "bench floor publisher", 16384)
	_, jsc := e.connect(t, "bench floor consumer")
	freshStream(t, js, jetstream.StreamConfig{Name: "FIRED", Subjects: []string{"fired.>"}, Storage: jetstream.FileStorage})
	defer func() { _ = js.DeleteStream(ctx, "FIRED") }()
	prefix := nextPrefix(l.kind)
	rec := newRecorder(l.n, prefix)
	var atNS atomic.Int64 // T, set just before the first publish
	cc := consumeFired(t, jsc, "FIRED", "fired.>", rec, func(nats.Header) (time.Time, bool) { return time.Unix(0, atNS.Load()), true })
	body := make([]byte, *flagBody)
	due := time.Now().Truncate(time.Millisecond) // the header's value only: its length is what costs
	msgs := make([]*nats.Msg, l.n)
	for i := range msgs {
		em := &envelope.Message{ID: msgID(prefix, i), DueAt: due}
		m := nats.NewMsg("fired.bench")
		m.Data = body
		for _, h := range em.OutHeaders(1) {
			m.Header.Add(h.Key, h.Value)
		}
		m.Header.Set(envelope.HeaderNatsMsgID, em.ID)
		msgs[i] = m
	}
	cpu := startCPU(0, e.rdb)
	at := time.Now()
	atNS.Store(at.UnixNano())
	pr := publish(t, js, l.n, 0, func(i int) *nats.Msg { return msgs[i] })
	all := rec.wait(30*time.Second, 2*time.Minute+time.Duration(l.n/500)*time.Second)
	dcpu := cpu.drain()
	cpu.stop(s)
	cc.Stop()
	rec.fill(s)
	s.PublishErrors = pr.errs
	s.setPublish(pr)
	s.setEndToEnd(pr.first, rec)
	s.setBurst(at, at, 0, time.Time{}, rec, nil, nil)
	s.Burst.CPU = dcpu
	s.finish(all)
	return s
}
