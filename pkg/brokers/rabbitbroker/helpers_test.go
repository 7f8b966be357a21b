package rabbitbroker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	amqp "github.com/rabbitmq/amqp091-go"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// unique is a queue or exchange name of the test's own.
func unique(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()) + "-" + hex.EncodeToString(b[:])
}

// admin is a plain amqp091-go client for the test's own declares, publishes
// and counts.
type admin struct {
	t    testing.TB
	conn *amqp.Connection
	ch   *amqp.Channel
}

func newAdmin(t testing.TB, url string) *admin {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	a := &admin{t: t, conn: conn, ch: ch}
	t.Cleanup(func() { conn.Close() })
	return a
}

// publish publishes persistent messages to queue and waits for their confirms.
func (a *admin) publish(queue string, pubs ...amqp.Publishing) {
	a.t.Helper()
	var dcs []*amqp.DeferredConfirmation
	for _, p := range pubs {
		p.DeliveryMode = amqp.Persistent
		dc, err := a.ch.PublishWithDeferredConfirm("", queue, false, false, p)
		if err != nil {
			a.t.Fatal(err)
		}
		dcs = append(dcs, dc)
	}
	for _, dc := range dcs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !ok {
			a.t.Fatalf("publish not confirmed: %v %v", ok, err)
		}
	}
}

func (a *admin) publishIDs(queue string, ids ...string) {
	a.t.Helper()
	pubs := make([]amqp.Publishing, len(ids))
	for i, id := range ids {
		pubs[i] = amqp.Publishing{MessageId: id, Body: []byte("body of " + id)}
	}
	a.publish(queue, pubs...)
}

// ready returns the queue's ready (not delivered) message count.
func (a *admin) ready(queue string) int {
	a.t.Helper()
	q, err := a.ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		a.t.Fatalf("passive declare %s: %v", queue, err)
	}
	return q.Messages
}

func (a *admin) queue(name string) string {
	a.t.Helper()
	if _, err := a.ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		a.t.Fatal(err)
	}
	return name
}

func (a *admin) get(queue string) amqp.Delivery {
	a.t.Helper()
	var d amqp.Delivery
	testenv.Eventually(a.t, 10*time.Second, func() bool {
		var ok bool
		var err error
		d, ok, err = a.ch.Get(queue, true)
		if err != nil {
			a.t.Fatal(err)
		}
		return ok
	}, "a message in %s", queue)
	return d
}

// arrived waits until queue held every ID of want, reading and acking what
// comes (a message more than once is fine: at least once), and says which
// did not arrive.
func (a *admin) arrived(t *testing.T, queue string, want map[string]bool, within time.Duration) {
	t.Helper()
	got := map[string]bool{}
	missing := func() int {
		n := 0
		for id := range want {
			if !got[id] {
				n++
			}
		}
		return n
	}
	ok := testenv.Poll(within, func() bool {
		for {
			d, ok, err := a.ch.Get(queue, true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			got[d.MessageId] = true
		}
		return missing() == 0
	})
	if !ok {
		for id := range want {
			if !got[id] {
				t.Errorf("%s did not arrive in %s", id, queue)
			}
		}
	}
}
