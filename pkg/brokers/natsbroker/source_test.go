package natsbroker_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/ingesttest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// ackWait is the JetStream redelivery timeout in these tests: short, so that
// the suite's redelivery checks after a reopen are quick.
const ackWait = 2 * time.Second

// Backlogs above the NATS Source defaults: MaxInFlight 1000 is JetStream's
// MaxAckPending, and 10×MaxInFlight core NATS's client pending limit.
const (
	jsBacklog   = 2000
	coreBacklog = 12000
)

func subject(key string) string { return "ingesttest." + key }

// publisher connects like an application, reconnecting quickly after a
// broker restart.
func publisher(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("ingesttest publisher"),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect publisher: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func natsMsg(key string, m ingesttest.Message) *nats.Msg {
	msg := nats.NewMsg(subject(key))
	msg.Data = m.Body
	for _, h := range m.Headers {
		msg.Header.Add(h.Key, h.Value)
	}
	return msg
}

func open(t *testing.T, cfg natsbroker.SourceParams) ingest.Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	config.Default(&cfg.MaxInFlight, config.DefaultMaxInFlight)
	config.Default(&cfg.AckWait, natsbroker.DefaultAckWait)
	src, err := natsbroker.NewSource(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("natsbroker.New: %v", err)
	}
	return src
}

// jetStreamServer starts a NATS server with JetStream and connects a
// publisher's JetStream client to it.
func jetStreamServer(t *testing.T) (*testenv.NATSServer, jetstream.JetStream) {
	t.Helper()
	ns := testenv.NATS(t)
	js, err := jetstream.New(publisher(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	return ns, js
}

func TestSourceConformanceJetStream(t *testing.T) {
	ns, js := jetStreamServer(t)
	ingesttest.Run(t, ingesttest.Harness{
		Open: func(t *testing.T, key string) ingest.Source {
			return open(t, natsbroker.SourceParams{
				Name:    key,
				URL:     ns.URL,
				Subject: subject(key),
				Stream:  "IT-" + key, // created by New
				Durable: "delaybridge",
				AckWait: ackWait,
			})
		},
		Publish: func(t *testing.T, key string, m ingesttest.Message) {
			t.Helper()
			msg := natsMsg(key, m)
			var err error
			// Retried: right after a broker restart the publisher may not
			// have reconnected yet.
			ok := testenv.Poll(30*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err = js.PublishMsg(ctx, msg)
				return err == nil
			})
			if !ok {
				t.Fatalf("publish to %s: %v", msg.Subject, err)
			}
		},
		SourceName: subject,
		Features: ingesttest.Features{
			AtLeastOnce:      true,
			Nack:             true,
			AckIndividually:  true,
			Ordered:          true,
			PublishedAt:      true,
			Origin:           ingesttest.OriginLog,
			DuplicateHeaders: true,
			// NATS headers are text lines; a 1 MiB message includes them.
			MaxBody: 1<<20 - 4096,
		},
		RedeliveryDelay: ackWait,
		Backlog:         jsBacklog,
		StopBroker:      func(*testing.T) { ns.Shutdown() },
		StartBroker:     func(*testing.T) { ns.Restart() },
	})
}

func TestSourceConformanceCoreNATS(t *testing.T) {
	ns := testenv.NATS(t)
	pub := publisher(t, ns.URL)
	ingesttest.Run(t, ingesttest.Harness{
		Open: func(t *testing.T, key string) ingest.Source {
			return open(t, natsbroker.SourceParams{Name: key, URL: ns.URL, Subject: subject(key)})
		},
		Publish: func(t *testing.T, key string, m ingesttest.Message) {
			t.Helper()
			// Core NATS keeps nothing: publish only once the server knows
			// the ingest's subscription (New does not wait for that, and
			// after a restart the subscription is sent again on reconnect).
			if !testenv.Poll(30*time.Second, func() bool {
				return ns.Server != nil && ns.Server.GlobalAccount().Interest(subject(key)) > 0
			}) {
				t.Fatalf("no subscriber for %s after 30s", subject(key))
			}
			if err := pub.PublishMsg(natsMsg(key, m)); err != nil {
				t.Fatalf("publish: %v", err)
			}
			if err := pub.FlushTimeout(10 * time.Second); err != nil {
				t.Fatalf("flush: %v", err)
			}
		},
		SourceName: subject,
		Features: ingesttest.Features{
			Ordered:          true,
			DuplicateHeaders: true,
			MaxBody:          1<<20 - 4096,
		},
		Backlog:     coreBacklog,
		StopBroker:  func(*testing.T) { ns.Shutdown() },
		StartBroker: func(*testing.T) { ns.Restart() },
	})
}

// TestCoreSubscribedWhenNewReturns: core NATS keeps nothing for a subject
// without subscribers, so a message published right after New returns is
// lost unless the subscription already reached the server.
func TestSourceCoreSubscribedWhenNewReturns(t *testing.T) {
	ns := testenv.NATS(t)
	for i := range 20 {
		subj := fmt.Sprintf("subscribed.%d", i)
		src := open(t, natsbroker.SourceParams{Name: "subscribed", URL: ns.URL, Subject: subj})
		n := ns.Server.GlobalAccount().Interest(subj)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = src.Close(ctx)
		cancel()
		if n == 0 {
			t.Fatalf("attempt %d: the server had no subscriber for %s when New returned", i, subj)
		}
	}
}

// rawPublish sends HPUB frames over a plain TCP connection, as a client
// with a broken header encoder would: nats.go itself cannot send a header
// block that is not NATS/1.0 followed by "Name: value" lines.
func rawPublish(t *testing.T, port int, subject string, frames ...[2]string) {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}\r\n")
	for _, f := range frames {
		hdr, body := f[0], f[1]
		fmt.Fprintf(c, "HPUB %s %d %d\r\n%s%s\r\n", subject, len(hdr), len(hdr)+len(body), hdr, body)
	}
	fmt.Fprintf(c, "PING\r\n")
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "PONG") {
		t.Fatalf("raw publish: %q %v", line, err)
	}
}

// TestSourceUndecodableHeaders: a message whose header block cannot be
// decoded reaches the pipeline with HeaderError set (so that it goes dead
// saying so), on JetStream and on core NATS; a valid message without
// headers and one with an empty header block do not.
func TestSourceUndecodableHeaders(t *testing.T) {
	ns := testenv.NATS(t)
	frames := [][2]string{
		{"GARBAGE\r\nx-delay: 5\r\n\r\n", "bad-version"},
		{"NATS/1.0\r\nx-delay 5\r\n\r\n", "no-colon"},
		{"NATS/1.0\r\nx-delay: 5\r\n", "unterminated"},
		{"NATS/1.0\r\n\r\n", "empty-block"},
		{"NATS/1.0\r\nx-delay: 5\r\n\r\n", "good"},
	}
	want := map[string]bool{"bad-version": true, "no-colon": true, "unterminated": true, "empty-block": false, "good": false, "none": false}
	for _, mode := range []string{"jetstream", "core"} {
		t.Run(mode, func(t *testing.T) {
			p := natsbroker.SourceParams{Name: "hdr-" + mode, URL: ns.URL, Subject: "hdr." + mode}
			if mode == "jetstream" {
				p.Stream, p.Durable = "HDR", "hdr"
			}
			src := open(t, p)
			t.Cleanup(func() { _ = src.Close(context.Background()) })
			rawPublish(t, ns.Port, p.Subject, frames...)
			pub := publisher(t, ns.URL)
			if err := pub.Publish(p.Subject, []byte("none")); err != nil {
				t.Fatal(err)
			}
			_ = pub.Flush()
			for range want {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				in, ack, err := src.Read(ctx)
				cancel()
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				_ = ack(context.Background(), nil)
				bad, known := want[string(in.Body)]
				switch {
				case !known:
					t.Errorf("unexpected message %q", in.Body)
				case bad && !strings.Contains(in.HeaderError, "could not decode headers"):
					t.Errorf("%s: HeaderError %q, want the decode error", in.Body, in.HeaderError)
				case !bad && in.HeaderError != "":
					t.Errorf("%s: HeaderError %q on a valid message", in.Body, in.HeaderError)
				}
				if v, _ := in.Headers.Get("x-delay"); string(in.Body) == "good" && v != "5" {
					t.Errorf("good: x-delay %q, want 5", v)
				}
			}
		})
	}
}

// Release returns when the server has the iterator's unsubscribe: until
// then a pull request of the released Source still takes new messages
// (a busy make test saw one published after Release read by it). Right
// after Release the server must know no subscription of its pull inbox.
func TestReleaseReturnsUnsubscribed(t *testing.T) {
	ns, js := jetStreamServer(t)
	for i := range 10 {
		src := open(t, natsbroker.SourceParams{Name: "rel", URL: ns.URL, Subject: subject("rel"), Stream: "REL", Durable: "delaybridge", AckWait: ackWait})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := js.Publish(ctx, subject("rel"), []byte("before")); err != nil {
			t.Fatal(err)
		}
		_, ack, err := src.Read(ctx) // the pull is running
		if err != nil {
			t.Fatal(err)
		}
		if err := ack(ctx, nil); err != nil {
			t.Fatal(err)
		}
		subs := ns.Server.NumSubscriptions()
		if err := src.(ingest.Releaser).Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if after := ns.Server.NumSubscriptions(); after >= subs {
			t.Fatalf("round %d: the server has %d subscriptions after Release, %d before: the pull inbox is still subscribed, and takes what is published next", i, after, subs)
		}
		if err := src.Close(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
}

// Close gives back what the pull fetched and the pipeline did not read: a
// graceful stop (the daemon's Run closes its sources after the pipeline
// returned) that dropped it left those messages to JetStream's ack wait,
// 30 s by default, and they came back that late (the fault suite's
// rolling upgrade and rollback: a message 15 s late with a 15 s ack wait).
// After Close another Source must read every one of them at once, long
// before the ack wait.
func TestCloseGivesBackWhatThePullFetched(t *testing.T) {
	const n = 50
	ns, js := jetStreamServer(t)
	params := natsbroker.SourceParams{Name: "close", URL: ns.URL, Subject: subject("close"), Stream: "CLOSE", Durable: "delaybridge", AckWait: 30 * time.Second}
	src := open(t, params)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range n {
		if _, err := js.Publish(ctx, subject("close"), fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	_, ack, err := src.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ack(ctx, nil); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, "CLOSE", "delaybridge")
	if err != nil {
		t.Fatal(err)
	}
	pending := func() int {
		info, err := cons.Info(ctx)
		if err != nil {
			return -1
		}
		return info.NumAckPending
	}
	// The pull fetched the others: delivered to this client, not read.
	testenv.Eventually(t, 10*time.Second, func() bool { return pending() == n-1 }, "the pull did not fetch the %d others", n-1)
	if err := src.Close(ctx); err != nil {
		t.Fatal(err)
	}
	other := open(t, params)
	defer other.Close(context.Background())
	for i := 1; i < n; i++ {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		_, ack, err := other.Read(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("another Source read %d of the %d messages the closed one had fetched within 5 s each (ack wait %v): %v", i-1, n-1, params.AckWait, err)
		}
		if err := ack(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSourceConsumerDeletedIsCreatedAgain: a durable consumer deleted
// under the ingest (an operator's `nats consumer rm`) ended Read with
// ErrClosed, which stopped the daemon. It is created again after the last
// message acknowledged: what was acknowledged is not read again, what was
// not is. A stream deleted and created again starts anew: its messages
// are read from its first, not skipped up to the old stream's floor.
func TestSourceConsumerDeletedIsCreatedAgain(t *testing.T) {
	ns, js := jetStreamServer(t)
	params := natsbroker.SourceParams{Name: "gone", URL: ns.URL, Subject: subject("gone"), Stream: "GONE", Durable: "delaybridge", AckWait: 30 * time.Second}
	src := open(t, params)
	defer src.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Not the account's only stream: deleting the last one, the server
	// removes the account's streams directory from a goroutine of its own,
	// and a stream created meanwhile fails ("error creating store for
	// stream": its mkdir finds no parent; 3 in 90 here under load).
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{subject("keep")}}); err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		for i := from; i <= to; i++ {
			if _, err := js.Publish(ctx, subject("gone"), fmt.Appendf(nil, "m%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	readFrom := func(src ingest.Source, ack bool) *envelope.Incoming {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		defer rcancel()
		in, ackf, err := src.Read(rctx)
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		if ack {
			if err := ackf(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		return in
	}
	read := func(ack bool) string { t.Helper(); return string(readFrom(src, ack).Body) }
	// Messages published and acknowledged one by one until the Source
	// knows a floor of ten or more (it reads it again as it reads, at
	// most every 2 s); then ten more, not acknowledged.
	k := 0
	var first time.Time // the first stream's creation, as its messages say
	testenv.Eventually(t, 30*time.Second, func() bool {
		k++
		publish(k, k)
		in := readFrom(src, true)
		if string(in.Body) != fmt.Sprintf("m%d", k) || in.Origin.Log != "GONE" || in.LogCreated.IsZero() {
			t.Fatalf("read %q from %q created %v, want m%d from GONE with its creation time", in.Body, in.Origin.Log, in.LogCreated, k)
		}
		first = in.LogCreated
		return natsbroker.StandingFloor(src) >= 10
	}, "the Source to know a floor of ten")
	floor := int(natsbroker.StandingFloor(src))
	publish(k+1, k+10)
	for i := k + 1; i <= k+10; i++ {
		if got := read(false); got != fmt.Sprintf("m%d", i) {
			t.Fatalf("read %q, want m%d", got, i)
		}
	}

	if err := js.DeleteConsumer(ctx, "GONE", "delaybridge"); err != nil {
		t.Fatal(err)
	}
	// Read again: what the floor does not cover (acknowledged after the
	// Source read it, or not acknowledged), nothing below it.
	seen := map[int]bool{}
	for len(seen) < 10 || !seen[k+10] {
		got := read(true)
		var n int
		if _, err := fmt.Sscanf(got, "m%d", &n); err != nil || n <= floor || n > k+10 {
			t.Fatalf("after the consumer was created again: read %q, want m%d..m%d (the floor was %d)", got, floor+1, k+10, floor)
		}
		if n > k {
			seen[n] = true
		}
	}
	if err := src.(ingest.Ready).Ready(); err != nil {
		t.Errorf("Ready after the consumer was created again: %v", err)
	}
	// Another instance, or this one restarted, opens the consumer so
	// created: where it starts cannot be updated, and is kept.
	other := open(t, params)
	if err := other.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Deleted while the Source is released (Redis away: no pull of its
	// waits to be told): Resume creates it again.
	if err := src.(ingest.Releaser).Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, "GONE", "delaybridge"); err != nil {
		t.Fatal(err)
	}
	if err := src.(ingest.Releaser).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	publish(k+11, k+15)
	for got := map[string]bool{}; len(got) < 5; {
		m := read(true)
		var n int
		if _, err := fmt.Sscanf(m, "m%d", &n); err != nil || n <= floor {
			t.Fatalf("after Resume: read %q, want m%d..m%d", m, floor+1, k+15)
		}
		if n > k+10 {
			got[m] = true
		}
	}

	// The stream deleted and created again: its sequences start anew.
	if err := js.DeleteStream(ctx, "GONE"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "GONE", Subjects: []string{subject("gone")}}); err != nil {
		t.Fatal(err)
	}
	publish(101, 105)
	// Its messages are numbered from 1 again: they say when their stream
	// was created (the pipeline reads a stream that is not the first of its
	// name under a log name of its own: ingest.LogRecorder).
	var created time.Time
	for i := 101; i <= 105; i++ {
		in := readFrom(src, true)
		if string(in.Body) != fmt.Sprintf("m%d", i) {
			t.Fatalf("the stream created again: read %q, want m%d", in.Body, i)
		}
		if created.IsZero() {
			created = in.LogCreated
		}
		if in.Origin.Log != "GONE" || in.LogCreated.IsZero() || !in.LogCreated.Equal(created) || !in.LogCreated.After(first) {
			t.Fatalf("a message of the stream created again: origin %+v created %v, want GONE created after the first stream (%v)", in.Origin, in.LogCreated, first)
		}
	}
	// A Source opened later (another instance, a restart) says the same.
	if err := src.Close(ctx); err != nil {
		t.Fatal(err)
	}
	again := open(t, params)
	defer again.Close(context.Background())
	publish(106, 106)
	if in := readFrom(again, true); string(in.Body) != "m106" || !in.LogCreated.Equal(created) {
		t.Fatalf("a Source opened after: read %q of a stream created %v, want m106 of %v", in.Body, in.LogCreated, created)
	}
}

// readAfter waits for the ingest's read of "after", the message published
// to the stream created again.
func readAfter(t *testing.T, ctx context.Context, got <-chan *envelope.Incoming) {
	t.Helper()
	select {
	case in := <-got:
		if string(in.Body) != "after" {
			t.Fatalf("read %q, want the message published after", in.Body)
		}
	case <-ctx.Done():
		t.Fatal("the message published to the stream created again was not read")
	}
}

// publishWhenItTakes publishes body to subj once a stream created again
// takes it (within d).
func publishWhenItTakes(t *testing.T, ctx context.Context, js jetstream.JetStream, subj, body string, d time.Duration) {
	t.Helper()
	testenv.Eventually(t, d, func() bool {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		_, err := js.Publish(pctx, subj, []byte(body))
		return err == nil
	}, "a message published to the stream created again")
}

// TestSourceReleasedWhileAnotherCreatesTheStreamAgain: an instance
// released (Redis away) while another created the stream and its consumer
// again reads the new stream's messages as the new stream's (their
// LogCreated), not under the old stream's creation, whose IDs the dedupe
// window remembers.
func TestSourceReleasedWhileAnotherCreatesTheStreamAgain(t *testing.T) {
	ns, js := jetStreamServer(t)
	params := natsbroker.SourceParams{Name: "renew", URL: ns.URL, Subject: subject("renew"), Stream: "RENEW", Durable: "delaybridge", AckWait: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := open(t, params)
	defer a.Close(context.Background())
	if _, err := js.Publish(ctx, subject("renew"), []byte("first")); err != nil {
		t.Fatal(err)
	}
	var old time.Time
	select {
	case in := <-readAsync(ctx, a):
		old = in.LogCreated
	case <-ctx.Done():
		t.Fatal("the first message not read")
	}
	b := open(t, params)
	defer b.Close(context.Background())
	if err := b.(ingest.Releaser).Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := readAsync(ctx, a) // a reads on: it creates the consumer again
	if err := js.DeleteStream(ctx, "RENEW"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool { // by a, or here, whichever is first
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RENEW", Subjects: []string{subject("renew")}})
		return err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse)
	}, "the stream created again")
	publishWhenItTakes(t, ctx, js, subject("renew"), "to a", 20*time.Second)
	select {
	case in := <-got:
		if in.LogCreated.Equal(old) || in.LogCreated.IsZero() {
			t.Fatalf("a read %q of a stream created %v, want after %v", in.Body, in.LogCreated, old)
		}
	case <-ctx.Done():
		t.Fatal("a read nothing of the stream created again")
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.(ingest.Releaser).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subject("renew"), []byte("to b")); err != nil {
		t.Fatal(err)
	}
	for {
		var in *envelope.Incoming
		select {
		case in = <-readAsync(ctx, b):
		case <-ctx.Done():
			t.Fatal("b read nothing after Resume")
		}
		if in.LogCreated.Equal(old) {
			t.Fatalf("b read %q of the stream created again as the old stream's (created %v)", in.Body, old)
		}
		if string(in.Body) == "to b" {
			break
		}
	}
}

// readAsync reads one message of src, acknowledged, on a channel.
func readAsync(ctx context.Context, src ingest.Source) <-chan *envelope.Incoming {
	ch := make(chan *envelope.Incoming, 1)
	go func() {
		in, ack, err := src.Read(ctx)
		if err == nil {
			_ = ack(ctx, nil)
			ch <- in
		}
	}()
	return ch
}

// TestSourceStreamDeletedUnderItIsLeftToItsDeletion: a stream deleted
// while the ingest reads it is created again by the ingest only once its
// deletion has had time to finish (recreateStreamAfter). The server tells
// the pull that its consumer is gone before it has moved the stream's files
// away; a stream created at once opened the old files and lost them to the
// deletion, a stream that answered no publish (a few deletions in ten
// here). Created later, it takes publishes, which the ingest reads.
func TestSourceStreamDeletedUnderItIsLeftToItsDeletion(t *testing.T) {
	ns, js := jetStreamServer(t)
	params := natsbroker.SourceParams{Name: "left", URL: ns.URL, Subject: subject("left"), Stream: "LEFT", Durable: "delaybridge", AckWait: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	src := open(t, params)
	defer src.Close(context.Background())
	got := readAsync(ctx, src)
	if err := js.DeleteStream(ctx, "LEFT"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var created time.Time
	// A deletion that finds no pull request of the ingest waiting is seen
	// only when two heartbeats do not come (PullExpiry; one in five here,
	// and TestSourceStreamDeletedBeforeItsPullArrived every time).
	testenv.Eventually(t, 60*time.Second, func() bool {
		info, err := js.Stream(ctx, "LEFT")
		if err == nil {
			created = info.CachedInfo().Created
		}
		return err == nil
	}, "the ingest did not create its stream again")
	// The ingest counts its wait from when it saw its consumer gone, before
	// DeleteStream answered here (by milliseconds, more on a loaded
	// machine); the window it waits out is milliseconds long.
	if d := created.Sub(deleted); d < natsbroker.RecreateStreamAfter/2 {
		t.Fatalf("the stream was created again %v after it was deleted, before its deletion could finish (the ingest waits %v)", d, natsbroker.RecreateStreamAfter)
	}
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if _, err := js.Publish(pctx, subject("left"), []byte("after")); err != nil {
		t.Fatalf("a publish to the stream created again: %v", err)
	}
	readAfter(t, ctx, got)
}

// TestSourceStreamDeletedBeforeItsPullArrived: a stream deleted while no
// pull request of the ingest waited at its consumer (the one the ingest
// sent next still on its way) is never reported to the ingest: the pull
// request reaches nothing and nothing answers it. The ingest notices by
// the server's heartbeats that do not come (two, PullExpiry), and creates
// the stream again RecreateStreamAfter on. nats.go's default pull waited
// 30 s for them.
func TestSourceStreamDeletedBeforeItsPullArrived(t *testing.T) {
	ns, js := jetStreamServer(t)
	proxy := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", ns.Port))
	// One message a pull request: the one that brings it leaves none
	// waiting.
	params := natsbroker.SourceParams{Name: "late", URL: "nats://" + proxy.Addr, Subject: subject("late"), Stream: "LATE", Durable: "delaybridge", AckWait: 30 * time.Second, MaxInFlight: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	src := open(t, params)
	defer src.Close(context.Background())
	got := readAsync(ctx, src)
	testenv.Eventually(t, 10*time.Second, func() bool {
		c, err := js.Consumer(ctx, "LATE", "delaybridge")
		return err == nil && c.CachedInfo().NumWaiting == 1
	}, "the ingest's pull request waiting at its consumer")
	proxy.Hold() // the next pull request stays on its way
	if _, err := js.Publish(ctx, subject("late"), []byte("first")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("the first message not read")
	}
	c, err := js.Consumer(ctx, "LATE", "delaybridge")
	if err != nil {
		t.Fatal(err)
	}
	if n := c.CachedInfo().NumWaiting; n != 0 {
		t.Fatalf("%d pull requests wait at the consumer, want none (the next one held)", n)
	}
	got = readAsync(ctx, src) // the ingest reads on
	if err := js.DeleteStream(ctx, "LATE"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	proxy.Flow()
	bound := 2*natsbroker.PullExpiry + natsbroker.RecreateStreamAfter
	testenv.Eventually(t, bound, func() bool {
		_, err := js.Stream(ctx, "LATE")
		return err == nil
	}, "the stream created again by its ingest")
	t.Logf("created again %v after its deletion", time.Since(deleted).Round(time.Millisecond))
	publishWhenItTakes(t, ctx, js, subject("late"), "after", 10*time.Second)
	readAfter(t, ctx, got)
}
