package testenv_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestFreePortIsUniqueAndBindable(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 20; i++ {
		p := testenv.FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < 20000 || p >= 32000 {
			t.Fatalf("port %d outside [20000,32000)", p)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("FreePort %d not bindable: %v", p, err)
		}
		ln.Close()
	}
}

func TestRedisKillStartKeepsAOF(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	r := testenv.Redis(t, testenv.WithAppendFsync("always"), testenv.WithArgs("--maxmemory-policy", "noeviction"))
	c := r.Client()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got := c.ConfigGet(ctx, "maxmemory-policy").Val()["maxmemory-policy"]; got != "noeviction" {
		t.Fatalf("WithArgs not applied: maxmemory-policy=%q", got)
	}
	for i := 0; i < 100; i++ {
		if err := c.ZAdd(ctx, "z", redis.Z{Score: float64(i), Member: fmt.Sprint("m", i)}).Err(); err != nil {
			t.Fatal(err)
		}
	}

	r.Kill()
	if r.Running() {
		t.Fatal("still running after Kill")
	}
	if conn, err := net.Dial("tcp", r.Addr); err == nil {
		conn.Close()
		t.Fatal("server still accepts connections after Kill")
	}

	r.Start()
	if n, err := c.ZCard(ctx, "z").Result(); err != nil || n != 100 {
		t.Fatalf("after Kill+Start: ZCARD = %d, %v; want 100 (AOF replay)", n, err)
	}
}

func TestRedisStopStartEverysec(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	r := testenv.Redis(t)
	c := r.Client()
	pipe := c.Pipeline()
	for i := 0; i < 1000; i++ {
		pipe.Set(ctx, fmt.Sprint("k", i), i, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	r.Stop() // graceful: the AOF is flushed even with everysec
	r.Start()
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 1000 {
		t.Fatalf("after Stop+Start: DBSIZE = %d, %v; want 1000", n, err)
	}
	if _, err := os.Stat(r.Dir + "/appendonlydir"); err != nil {
		t.Fatalf("no AOF dir: %v", err)
	}
}

func TestRedisCluster(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	start := time.Now()
	cl := testenv.RedisCluster(t, 3)
	t.Logf("cluster of 3 ready in %v: %v", time.Since(start).Round(time.Millisecond), cl.Addrs)
	c := cl.Client()

	// {a}, {b}, {c}... hash to many slots, so some land on every master.
	for i := 0; i < 60; i++ {
		key := fmt.Sprintf("{k%d}:x", i)
		if err := c.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
	}
	var mastersWithKeys atomic.Int32
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if n > 0 {
			mastersWithKeys.Add(1)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := mastersWithKeys.Load(); got != 3 {
		t.Fatalf("keys on %d masters, want 3", got)
	}
	if v, err := c.Get(ctx, "{k7}:x").Int(); err != nil || v != 7 {
		t.Fatalf("GET = %d, %v", v, err)
	}
	// A script touching keys of different slots is refused; with one hash tag it works.
	if err := c.Eval(ctx, "return redis.call('MGET', KEYS[1], KEYS[2])", []string{"{k1}:x", "{k2}:x"}).Err(); err == nil {
		t.Fatal("cross-slot script accepted")
	}
	if err := c.Eval(ctx, "return redis.call('MGET', KEYS[1], KEYS[2])", []string{"{k1}:x", "{k1}:y"}).Err(); err != nil {
		t.Fatalf("same-slot script: %v", err)
	}

	// A stopped master comes back with its slots and (AOF) data. (Kill instead of Stop
	// could lose the last second of writes: appendfsync everysec.)
	node := cl.Nodes[0]
	node.Stop()
	node.Start()
	cl.WaitHealthy(30 * time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool {
		for i := 0; i < 60; i++ {
			if v, err := c.Get(ctx, fmt.Sprintf("{k%d}:x", i)).Int(); err != nil || v != i {
				return false
			}
		}
		return true
	}, "cluster serves every key after a node restart")
}

func TestNATSJetStreamRestartKeepsStream(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	n := testenv.NATS(t)

	nc, err := nats.Connect(n.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if _, err := js.Publish(ctx, "ev.x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}

	var disconnected atomic.Bool
	nc.SetDisconnectErrHandler(func(*nats.Conn, error) { disconnected.Store(true) })
	n.Restart()
	testenv.Eventually(t, 10*time.Second, disconnected.Load, "client saw the disconnect")
	testenv.Eventually(t, 10*time.Second, nc.IsConnected, "client reconnected after Restart")

	s, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 10 {
		t.Fatalf("after restart: %d messages, want 10", info.State.Msgs)
	}
}

func TestKafkaProduceGroupConsumeRestart(t *testing.T) {
	ctx := ctxT(t, 90*time.Second)
	k := testenv.Kafka(t, testenv.WithTopic("events", 3))
	k.CreateTopic(t, "other", 2)
	if len(k.Brokers) != 3 {
		t.Fatalf("brokers = %v", k.Brokers)
	}

	w := &kafka.Writer{
		Addr:         kafka.TCP(k.Brokers...),
		Topic:        "events",
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		Balancer:     &kafka.Hash{},
	}
	defer w.Close()
	write := func(from, to int) {
		t.Helper()
		var msgs []kafka.Message
		for i := from; i < to; i++ {
			msgs = append(msgs, kafka.Message{
				Key:     []byte(fmt.Sprint("key", i)),
				Value:   []byte(strconv.Itoa(i)),
				Headers: []kafka.Header{{Key: "h", Value: []byte("v")}},
			})
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	newReader := func() *kafka.Reader {
		return kafka.NewReader(kafka.ReaderConfig{
			Brokers:           k.Brokers,
			GroupID:           "g1",
			Topic:             "events",
			MinBytes:          1,
			MaxBytes:          10e6,
			MaxWait:           100 * time.Millisecond,
			SessionTimeout:    2 * time.Second,
			HeartbeatInterval: 200 * time.Millisecond,
			RebalanceTimeout:  2 * time.Second,
			StartOffset:       kafka.FirstOffset,
		})
	}
	consume := func(r *kafka.Reader, n int) map[string]bool {
		t.Helper()
		got := map[string]bool{}
		for len(got) < n {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				t.Fatalf("fetch after %d: %v", len(got), err)
			}
			if len(m.Headers) != 1 || string(m.Headers[0].Value) != "v" {
				t.Fatalf("headers = %v", m.Headers)
			}
			got[string(m.Value)] = true
			if err := r.CommitMessages(ctx, m); err != nil {
				t.Fatalf("commit: %v", err)
			}
		}
		return got
	}

	write(0, 30)
	r := newReader()
	if got := consume(r, 30); len(got) != 30 {
		t.Fatalf("consumed %d distinct, want 30", len(got))
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart: same ports, persisted topics, records and committed offsets.
	k.Restart()
	write(30, 35)
	r = newReader()
	defer r.Close()
	got := consume(r, 5)
	for i := 30; i < 35; i++ {
		if !got[strconv.Itoa(i)] {
			t.Fatalf("after restart got %v, want exactly 30..34 (committed offsets kept)", got)
		}
	}
}

// AddUser creates a user that can log in, and a second call with another
// password changes it (its one rabbitmqctl eval takes either path).
func TestRabbitMQAddUserTwice(t *testing.T) {
	rb := testenv.RabbitMQ(t)
	user := fmt.Sprintf("testenv-%d", time.Now().UnixNano())
	url := func(pw string) string { return fmt.Sprintf("amqp://%s:%s@127.0.0.1:%d/", user, pw, rb.Port) }
	rb.AddUser(t, user, "first 'pw\"") // quotes reach the node as bytes
	conn, err := amqp.Dial(url("first%20%27pw%22"))
	if err != nil {
		t.Fatalf("log in as the new user: %v", err)
	}
	conn.Close()
	rb.AddUser(t, user, "second")
	if conn, err = amqp.Dial(url("second")); err != nil {
		t.Fatalf("log in with the changed password: %v", err)
	}
	conn.Close()
	if conn, err := amqp.Dial(url("first%20%27pw%22")); err == nil {
		conn.Close()
		t.Fatal("the old password still logs in after the second AddUser")
	}
}

func TestRabbitMQDurableQueueSurvivesRestart(t *testing.T) {
	start := time.Now()
	rb := testenv.RabbitMQ(t)
	t.Logf("rabbitmq ready in %v at %s", time.Since(start).Round(time.Millisecond), rb.URL)

	publish := func(q string, body string, persistent bool) {
		t.Helper()
		conn, err := amqp.Dial(rb.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		mode := amqp.Transient
		if persistent {
			mode = amqp.Persistent
		}
		ctx := ctxT(t, 30*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{Body: []byte(body), DeliveryMode: mode})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v %v", ok, err)
		}
	}
	getOne := func(q string) string {
		t.Helper()
		conn, err := amqp.Dial(rb.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-deliveries:
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
			return string(d.Body)
		case <-time.After(20 * time.Second):
			t.Fatalf("no delivery from %s", q)
			return ""
		}
	}

	conn, err := amqp.Dial(rb.URL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("testenv.durable", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("testenv.transient", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	publish("testenv.transient", "hello", false)
	if got := getOne("testenv.transient"); got != "hello" {
		t.Fatalf("got %q", got)
	}
	publish("testenv.durable", "survivor", true)
	if out := rb.Ctl(t, "list_queues", "name", "messages"); !strings.Contains(out, "testenv.durable") {
		t.Fatalf("rabbitmqctl list_queues:\n%s", out)
	}

	stop := time.Now()
	rb.Stop(t)
	t.Logf("rabbitmq stopped in %v", time.Since(stop).Round(time.Millisecond))
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("client connection not closed by Stop")
	}
	if _, err := amqp.Dial(rb.URL); err == nil {
		t.Fatal("dial succeeded while stopped")
	}

	restart := time.Now()
	rb.Start(t)
	t.Logf("rabbitmq restarted in %v", time.Since(restart).Round(time.Millisecond))
	if got := getOne("testenv.durable"); got != "survivor" {
		t.Fatalf("after restart got %q", got)
	}

	// The next RabbitMQ call returns the same, running node.
	if again := testenv.RabbitMQ(t); again != rb {
		t.Fatal("RabbitMQ returned a different node")
	}
}

func TestStartProcess(t *testing.T) {
	bin := testenv.BuildPackage(t, "./internal/testenv/testdata/helper")
	if again := testenv.BuildPackage(t, "./internal/testenv/testdata/helper"); again != bin {
		t.Fatalf("second build gave %s, want cached %s", again, bin)
	}

	p := testenv.StartProcess(t, bin)
	p.WaitOutput(10*time.Second, "ready")
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(10 * time.Second); code != 3 {
		t.Fatalf("exit code %d, want 3; output:\n%s", code, p.Output())
	}
	if !strings.Contains(p.Output(), "got SIGTERM") {
		t.Fatalf("stderr not captured: %q", p.Output())
	}

	p = testenv.StartProcessWith(t, testenv.ProcessOptions{Env: []string{"X=1"}}, bin)
	p.WaitOutput(10*time.Second, "ready")
	p.Kill()
	if code := p.Wait(time.Second); code != -1 {
		t.Fatalf("exit code after SIGKILL = %d, want -1", code)
	}

	p = testenv.StartProcess(t, bin, "7")
	if code := p.Wait(10 * time.Second); code != 7 {
		t.Fatalf("exit code %d, want 7", code)
	}

	// A build with tags is a binary of its own, with the tagged file in.
	tagged := testenv.BuildPackageTagged(t, "./internal/testenv/testdata/helper", "testenvtag")
	if tagged == bin {
		t.Fatalf("the tagged build reused the untagged binary %s", bin)
	}
	p = testenv.StartProcess(t, tagged, "0")
	p.Wait(10 * time.Second)
	if !strings.Contains(p.Output(), "built with testenvtag") {
		t.Fatalf("the tagged build lacks its tagged file; output %q", p.Output())
	}
	p = testenv.StartProcess(t, bin, "0")
	p.Wait(10 * time.Second)
	if strings.Contains(p.Output(), "built with testenvtag") {
		t.Fatalf("the untagged build has the tagged file")
	}
}
