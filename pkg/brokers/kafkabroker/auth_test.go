package kafkabroker_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers"
	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// secret is the password of every test user: no error may contain it.
const secret = "kafka-pw-4f2a-secret"

const topic = "delayed"

// authCase is a kfake cluster requiring some authentication, the
// configuration that passes it, and configurations it must refuse, each
// with a word its error must contain: what to check.
type authCase struct {
	name string
	opts func(testing.TB, *testenv.Certs) []kfake.Opt
	good func(testing.TB, *testenv.Certs) kafkabroker.Auth
	bad  map[string]badAuth
}

type badAuth struct {
	auth func(*testenv.Certs) kafkabroker.Auth
	hint string
}

func sasl(mechanism, password string) kafkabroker.SASL {
	return kafkabroker.SASL{Mechanism: mechanism, Username: "delaybridge", Password: config.Secret(password)}
}

func caTLS(c *testenv.Certs) config.TLS { return config.TLS{Enabled: true, CAFile: c.CAFile} }

func otherCATLS(c *testenv.Certs) config.TLS { return config.TLS{Enabled: true, CAFile: c.OtherCAFile} }

var authCases = []authCase{
	{
		name: "PLAIN over TLS",
		opts: func(t testing.TB, c *testenv.Certs) []kfake.Opt {
			return []kfake.Opt{kfake.TLS(c.ServerTLS(t, false)), kfake.EnableSASL(), kfake.Superuser("PLAIN", "delaybridge", secret)}
		},
		good: func(_ testing.TB, c *testenv.Certs) kafkabroker.Auth {
			return kafkabroker.Auth{TLS: caTLS(c), SASL: sasl("plain", secret)}
		},
		bad: map[string]badAuth{
			"wrong password": {func(c *testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{TLS: caTLS(c), SASL: sasl("plain", "wrong-password")}
			}, "sasl.password"},
			"wrong CA": {func(c *testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{TLS: otherCATLS(c), SASL: sasl("plain", secret)}
			}, "tls.ca_file"},
			"no TLS": {func(c *testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{SASL: sasl("plain", secret)}
			}, "tls"},
		},
	},
	{
		name: "SCRAM-SHA-256",
		opts: func(testing.TB, *testenv.Certs) []kfake.Opt {
			return []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "delaybridge", secret)}
		},
		good: func(testing.TB, *testenv.Certs) kafkabroker.Auth {
			return kafkabroker.Auth{SASL: sasl("scram-sha-256", secret)}
		},
		bad: map[string]badAuth{
			"wrong password": {func(*testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{SASL: sasl("scram-sha-256", "wrong-password")}
			}, "sasl.password"},
			"wrong mechanism": {func(*testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{SASL: sasl("scram-sha-512", secret)}
			}, "sasl.mechanism"},
			"no SASL": {func(*testenv.Certs) kafkabroker.Auth { return kafkabroker.Auth{} }, "sasl"},
		},
	},
	{
		// With TLS too, and the password from a file.
		name: "SCRAM-SHA-512 over TLS",
		opts: func(t testing.TB, c *testenv.Certs) []kfake.Opt {
			return []kfake.Opt{kfake.TLS(c.ServerTLS(t, false)), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "delaybridge", secret)}
		},
		good: func(t testing.TB, c *testenv.Certs) kafkabroker.Auth {
			file := filepath.Join(c.Dir, "kafka-password")
			if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return kafkabroker.Auth{TLS: caTLS(c), SASL: kafkabroker.SASL{Mechanism: "scram-sha-512", Username: "delaybridge", PasswordFile: file}}
		},
		bad: map[string]badAuth{
			"wrong password": {func(c *testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{TLS: caTLS(c), SASL: sasl("scram-sha-512", "wrong-password")}
			}, "sasl.password"},
			"wrong CA": {func(c *testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{TLS: otherCATLS(c), SASL: sasl("scram-sha-512", secret)}
			}, "tls.ca_file"},
		},
	},
	{
		name: "mutual TLS",
		opts: func(t testing.TB, c *testenv.Certs) []kfake.Opt { return []kfake.Opt{kfake.TLS(c.ServerTLS(t, true))} },
		good: func(_ testing.TB, c *testenv.Certs) kafkabroker.Auth {
			return kafkabroker.Auth{TLS: config.TLS{Enabled: true, CAFile: c.CAFile, CertFile: c.ClientCert, KeyFile: c.ClientKey}}
		},
		bad: map[string]badAuth{
			"no client certificate": {func(c *testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{TLS: caTLS(c)}
			}, "tls.cert_file"},
			"wrong CA": {func(c *testenv.Certs) kafkabroker.Auth {
				return kafkabroker.Auth{TLS: config.TLS{Enabled: true, CAFile: c.OtherCAFile, CertFile: c.ClientCert, KeyFile: c.ClientKey}}
			}, "tls.ca_file"},
		},
	},
}

// TestAuth runs, for every way to authenticate, the ingest, the sink and
// `send` as the daemon builds them from the configuration, against a kfake
// cluster of three brokers that requires it: with the right settings `send`
// and the sink produce to every partition and the ingest reads it all; with
// wrong ones each fails with an error that says what to check and never
// contains the password, and the sink's Ready says why.
func TestAuth(t *testing.T) {
	for _, c := range authCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			certs := testenv.NewCerts(t, "delaybridge")
			k := testenv.Kafka(t, testenv.WithoutPersistence(), testenv.WithTopic(topic, 3), testenv.WithKfakeOpts(c.opts(t, certs)...))
			good := c.good(t, certs)
			t.Run("right", func(t *testing.T) { roundTrip(t, k.Brokers, good) })
			for name, b := range c.bad {
				t.Run(name, func(t *testing.T) { refused(t, k.Brokers, b.auth(certs), b.hint) })
			}
		})
	}
}

func ingestConfig(addrs []string, a kafkabroker.Auth) config.Ingest {
	ic := config.Ingest{Name: "in", Broker: &kafkabroker.IngestConfig{
		Auth: a, Brokers: addrs, Topic: topic, Group: "delaybridge",
		SessionTimeout: config.Duration(2 * time.Second), CommitInterval: config.Duration(20 * time.Millisecond),
	}}
	ic.Broker.ApplyDefaults(&ic)
	return ic
}

func sinkConfig(addrs []string, a kafkabroker.Auth) config.Sink {
	sc := config.Sink{Name: "out", Broker: &kafkabroker.SinkConfig{Auth: a, Brokers: addrs}}
	sc.Broker.ApplyDefaults()
	return sc
}

func outgoing(i int) sinks.Outgoing {
	return sinks.Outgoing{Attempt: 1, Message: &envelope.Message{
		ID: fmt.Sprintf("m%d", i), Destination: topic, DueAt: time.Now(),
		Key: []byte(fmt.Sprintf("key-%d", i)), Body: []byte(fmt.Sprintf("from the sink %d", i)),
	}}
}

func roundTrip(t *testing.T, addrs []string, a kafkabroker.Auth) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	log := testLog(t)

	ic := ingestConfig(addrs, a)
	src, err := brokers.OpenSource(ctx, &ic, log)
	if err != nil {
		t.Fatalf("ingest: %v", err)
	}
	defer func() {
		if err := src.Close(context.Background()); err != nil {
			t.Errorf("ingest close: %v", err)
		}
	}()

	want := map[string]bool{}
	for i := range 6 {
		body := fmt.Sprintf("from send %d", i)
		req := brokers.SendRequest{Ingest: "in", Delay: "1m", Key: []byte(fmt.Sprintf("send-%d", i)), Body: []byte(body)}
		if _, err := brokers.Send(ctx, &config.Config{Ingest: []config.Ingest{ic}}, req); err != nil {
			t.Fatalf("send: %v", err)
		}
		want[body] = true
	}

	sink, err := brokers.OpenSink(ctx, ptr(sinkConfig(addrs, a)), log)
	if err != nil {
		t.Fatalf("sink: %v", err)
	}
	defer sink.Close()
	if err := sink.(sinks.Ready).Ready(); err != nil {
		t.Errorf("sink ready: %v", err)
	}
	var msgs []sinks.Outgoing
	for i := range 12 { // enough keys for every partition
		msgs = append(msgs, outgoing(i))
		want[string(msgs[i].Body)] = true
	}
	for i, err := range sink.Publish(ctx, msgs) {
		if err != nil {
			t.Fatalf("sink publish %d: %v", i, err)
		}
	}

	partitions := map[string]bool{}
	for len(want) > 0 {
		in, ack, err := src.Read(ctx)
		if err != nil {
			t.Fatalf("ingest read (%d records missing): %v", len(want), err)
		}
		delete(want, string(in.Body))
		p, _, _ := strings.Cut(strings.TrimPrefix(in.Origin.PositionID(), topic+"/"), "/")
		partitions[p] = true
		if err := ack(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(partitions) != 3 {
		t.Errorf("read from partitions %v, want all 3 (every broker)", partitions)
	}
	if err := src.(ingest.Ready).Ready(); err != nil {
		t.Errorf("ingest ready after reading: %v", err)
	}
}

func refused(t *testing.T, addrs []string, a kafkabroker.Auth, hint string) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	log := testLog(t)
	check := func(what string, err error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s: no error", what)
		case strings.Contains(err.Error(), secret):
			t.Errorf("%s: the password is in the error: %v", what, err)
		case !strings.Contains(err.Error(), "check") || !strings.Contains(err.Error(), hint):
			t.Errorf("%s: the error does not say to check %s: %v", what, hint, err)
		default:
			t.Logf("%s: %v", what, err)
		}
	}

	ic := ingestConfig(addrs, a)
	src, err := brokers.OpenSource(ctx, &ic, log)
	if err == nil {
		_ = src.Close(ctx)
	}
	check("ingest", err)

	_, err = brokers.Send(ctx, &config.Config{Ingest: []config.Ingest{ic}}, brokers.SendRequest{Ingest: "in", Delay: "1m", Body: []byte("x")})
	check("send", err)

	sink, err := brokers.OpenSink(ctx, ptr(sinkConfig(addrs, a)), log)
	if err != nil {
		t.Fatalf("sink: %v (it should connect only when used)", err)
	}
	defer sink.Close()
	check("sink ready", sink.(sinks.Ready).Ready())
	check("sink publish", sink.Publish(ctx, []sinks.Outgoing{outgoing(0)})[0])
}

// TestIngestReadyAfterCredentialsChange: an ingest that is reading when its
// password stops working (here: the cluster comes back with another one)
// reports in Ready that the broker refuses the credentials.
func TestIngestReadyAfterCredentialsChange(t *testing.T) {
	k := testenv.Kafka(t, testenv.WithoutPersistence(), testenv.WithTopic(topic, 3),
		testenv.WithKfakeOpts(kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "delaybridge", secret)))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ic := ingestConfig(k.Brokers, kafkabroker.Auth{SASL: sasl("scram-sha-256", secret)})
	src, err := brokers.OpenSource(ctx, &ic, testLog(t))
	if err != nil {
		t.Fatalf("ingest: %v", err)
	}
	defer src.Close(context.Background())
	if _, err := brokers.Send(ctx, &config.Config{Ingest: []config.Ingest{ic}}, brokers.SendRequest{Ingest: "in", Delay: "1m", Body: []byte("x")}); err != nil {
		t.Fatalf("send: %v", err)
	}
	_, ack, err := src.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	_ = ack(ctx, nil)
	ready := src.(ingest.Ready)
	if err := ready.Ready(); err != nil {
		t.Fatalf("ready while reading: %v", err)
	}

	// The same ports, another password.
	var ports []int
	for _, b := range k.Brokers {
		_, p, _ := net.SplitHostPort(b)
		n, _ := strconv.Atoi(p)
		ports = append(ports, n)
	}
	k.Close()
	c, err := kfake.NewCluster(kfake.NumBrokers(len(ports)), kfake.Ports(ports...), kfake.GroupMinSessionTimeout(time.Second),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "delaybridge", "another-password"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateTopic(topic, 3, nil); err != nil {
		t.Fatal(err)
	}

	var last error
	testenv.Eventually(t, 30*time.Second, func() bool {
		last = ready.Ready()
		return last != nil && strings.Contains(last.Error(), "sasl.password")
	}, "Ready to say the credentials are refused")
	if strings.Contains(last.Error(), secret) {
		t.Errorf("the password is in the error: %v", last)
	}
	t.Logf("ready: %v", last)
}

// testLog returns a logger writing warnings and above to t until the test
// ends.
func testLog(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

func ptr[T any](v T) *T { return &v }
