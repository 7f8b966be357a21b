package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// TestCancelAnswered204IsNeverPublished: cancels sent from 40 ms before to
// 10 ms after the due instant of 300 messages, with fire ahead on (the
// default): a message whose cancel was answered 204 is never published,
// one answered 409 (being published, with Retry-After) at most once, and
// one answered 404 was delivered before it: a cancel that meets a message
// in flight must not answer 204 while its publish goes on.
func TestCancelAnswered204IsNeverPublished(t *testing.T) {
	e := newNATSEnv(t, "", "")
	const n = 300
	due := time.Now().Add(2500 * time.Millisecond).Truncate(time.Millisecond)
	ids := e.parkAt("cancel", n, due)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.d.stats().Parked == n || time.Now().After(due) })

	codes := make([]int, n)
	retryAfter := make([]string, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		at := due.Add(-40*time.Millisecond + time.Duration(i)*50*time.Millisecond/n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-time.After(time.Until(at)) // the scenario's instant, not a synchronisation
			req, _ := http.NewRequest(http.MethodDelete, e.d.admin+"/v1/messages/"+id, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i], retryAfter[i] = resp.StatusCode, resp.Header.Get("Retry-After")
		}()
	}
	wg.Wait()
	// Everything that was going to be published has been once nothing is
	// parked: a 409 whose publish failed would be scheduled again.
	testenv.Eventually(t, 30*time.Second, func() bool { return e.d.stats().Parked == 0 }, "messages still parked")
	e.caughtUp()

	count := map[int]int{}
	for i, id := range ids {
		count[codes[i]]++
		copies := len(e.firedCopies(id))
		switch codes[i] {
		case http.StatusNoContent:
			if copies != 0 {
				t.Errorf("%s: cancel answered 204, published %d times", id, copies)
			}
		case http.StatusConflict:
			if copies > 1 || retryAfter[i] == "" {
				t.Errorf("%s: cancel answered 409 (Retry-After %q), published %d times", id, retryAfter[i], copies)
			}
		case http.StatusNotFound:
			if copies != 1 {
				t.Errorf("%s: cancel answered 404 (delivered), published %d times", id, copies)
			}
		default:
			t.Errorf("%s: cancel answered %d", id, codes[i])
		}
	}
	t.Logf("answers: %s", fmt.Sprint(count))
}

// TestDeliveredIsUnknownAtOnce: a consumer that cancels or reads a message
// the moment it gets it hears that it is unknown (404: delivered), not in
// flight (409), though its ack may be waiting to ride with the shard's next
// commit, here that of a message due 40 ms later on the same shard.
func TestDeliveredIsUnknownAtOnce(t *testing.T) {
	e := newNATSEnv(t, "", "")
	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("fired.delivered")
	if err != nil {
		t.Fatal(err)
	}
	const pairs = 8
	due := time.Now().Add(2 * time.Second).Truncate(time.Millisecond)
	firsts := map[string]bool{}
	for i := range pairs {
		first := fmt.Sprintf("first-%d", i)
		next := first
		for j := 0; next == first || store.ShardOf(next, config.DefaultShards) != store.ShardOf(first, config.DefaultShards); j++ {
			next = fmt.Sprintf("next-%d-%d", i, j)
		}
		firsts[first] = true
		at := due.Add(time.Duration(i) * 150 * time.Millisecond)
		for id, at := range map[string]time.Time{first: at, next: at.Add(40 * time.Millisecond)} {
			e.publish("delayed.delivered", []byte("x"), envelope.HeaderDeliverAt, at.UTC().Format(time.RFC3339Nano),
				envelope.HeaderMessageID, id, envelope.HeaderDestination, "fired.delivered")
		}
	}
	for seen := 0; seen < pairs; {
		m, err := sub.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("after %d of the %d first messages: %v", seen, pairs, err)
		}
		id := m.Header.Get(envelope.HeaderMessageID)
		if !firsts[id] {
			continue
		}
		seen++
		if code, body := e.d.do(http.MethodDelete, "/v1/messages/"+id, nil); code != http.StatusNotFound {
			t.Errorf("DELETE of %s, delivered: %d %s, want 404", id, code, body)
		}
		if code, body := e.d.get("/v1/messages/"+id, nil); code != http.StatusNotFound {
			t.Errorf("GET of %s, delivered: %d %s, want 404", id, code, body)
		}
	}
}

// TestArmedAgainIsDeliveredAgain: a message that reuses a delivered ID (an
// order timer armed again) is delivered again, though the sink stream's
// duplicate window (2 min) knows its Nats-Msg-Id; and so is a new series
// of an ID whose series has ended.
func TestArmedAgainIsDeliveredAgain(t *testing.T) {
	e := newNATSEnv(t, "", "")
	for i, body := range []string{"armed", "armed again", "armed a third time"} {
		e.publish("delayed.rearm", []byte(body), envelope.HeaderDelay, "50", envelope.HeaderMessageID, "timer-7", envelope.HeaderDestination, "fired.rearm")
		testenv.Eventually(t, 30*time.Second, func() bool { return len(e.firedCopies("timer-7")) == i+1 }, "version %d of timer-7 not delivered", i+1)
	}
	for i := range 2 {
		e.publish("delayed.rearm", []byte(fmt.Sprint("series ", i)), envelope.HeaderDelay, "50", envelope.HeaderEvery, "1s", envelope.HeaderCount, "1",
			envelope.HeaderMessageID, "series-7", envelope.HeaderDestination, "fired.rearm")
		testenv.Eventually(t, 30*time.Second, func() bool { return len(e.firedCopies("series-7")) == i+1 }, "series %d of series-7 not delivered", i+1)
	}
	for id, want := range map[string]int{"timer-7": 3, "series-7": 2} {
		if got := len(e.firedCopies(id)); got != want {
			t.Errorf("%s: %d copies, want %d", id, got, want)
		}
	}
}

// TestUnconfirmedPublishIsNotCancelled: the sink's broker stores a publish
// and its confirmation does not come within scheduler.publish_timeout (the
// answers from its server held by a proxy). The daemon cannot know that it
// was stored, so it must not answer a cancel 204 (the previous build did,
// and the message had been published) nor move it: 409 until a publish of
// it is confirmed, after which it is gone (404), and the sink stream holds
// it once (its Nats-Msg-Id drops the copy published again).
func TestUnconfirmedPublishIsNotCancelled(t *testing.T) {
	var proxy *testenv.Proxy
	e := newNATSEnvEdit(t, func(e *natsEnv, cfg string) string {
		proxy = testenv.NewProxy(t, strings.TrimPrefix(e.nats.URL, "nats://"))
		sink := fmt.Sprintf(`nats: {url: "%s", jetstream: true}`, e.nats.URL)
		if !strings.Contains(cfg, sink) {
			t.Fatalf("no sink %s in\n%s", sink, cfg)
		}
		return strings.Replace(cfg, sink, fmt.Sprintf(`nats: {url: "nats://%s", jetstream: true}`, proxy.Addr), 1)
	}, ", publish_timeout: 500ms")
	const id = "unconfirmed-1"
	e.publish("delayed.x", []byte("pay"), envelope.HeaderDelay, "1500ms", envelope.HeaderMessageID, id)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 1 }, "parked")
	proxy.Stall()
	e.waitFired(10*time.Second, id) // stored by the sink's server, its PubAck held
	var v struct {
		State     string `json:"state"`
		LastError string `json:"last_error"`
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := e.d.get("/v1/messages/"+id, &v)
		return code == http.StatusOK && v.State != "inflight"
	}, "the publish given up on after publish_timeout")
	if code, body := e.d.do(http.MethodDelete, "/v1/messages/"+id, nil); code != http.StatusConflict {
		t.Errorf("DELETE of a message stored by the broker, its publish unconfirmed (%s, %q): %d %s, want 409", v.State, v.LastError, code, body)
	}
	if code, body := e.d.do(http.MethodPost, "/v1/messages/"+id+"/fire", nil); code != http.StatusConflict {
		t.Errorf("fire of it: %d %s, want 409", code, body)
	}
	proxy.Flow()
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, _ := e.d.get("/v1/messages/"+id, nil)
		return code == http.StatusNotFound
	}, "the message delivered once its publish is confirmed")
	e.caughtUp()
	if n := len(e.firedCopies(id)); n != 1 {
		t.Errorf("%d copies in the sink stream, want 1", n)
	}
}
