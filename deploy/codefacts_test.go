package deploy_test

// The deploy tests' one window onto delaybridge's own Go API. Everything that
// imports the project (loading a configuration, the command line, the admin
// handler, named constants) is in this file, behind the few functions below,
// so that a change of that API is adapted here and nowhere else.

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/cli"
	"github.com/delaybridge/delaybridge/pkg/admin"
	_ "github.com/delaybridge/delaybridge/pkg/brokers" // registers the broker blocks with config
	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
)

const (
	binaryName    = "delaybridge"
	modulePath    = "github.com/delaybridge/delaybridge"
	mainPackage   = "./cmd/delaybridge"
	versionSymbol = modulePath + "/cmd/delaybridge/cli.version" // what -ldflags -X stamps
)

// defaultShutdownTimeout is shutdown_timeout when a configuration does not
// set it: the budget of the whole graceful stop (daemon.Run).
func defaultShutdownTimeout() time.Duration { return config.DefaultShutdownTimeout }

// configFacts is what the deploy files are checked against, taken from one
// configuration loaded the way the daemon loads it.
type configFacts struct {
	adminListen     string // "" when the admin server is off
	adminToken      bool   // admin.token is set
	shutdownTimeout time.Duration
	hosts           map[string]string // every broker and Redis host -> a field naming it
	needs           []brokerObject    // what must exist on the brokers before delivery works
}

// brokerObject is a topic, queue or stream subject that delaybridge uses but
// does not create itself.
type brokerObject struct {
	field string // the configuration field that names it, e.g. ingest[1].kafka.topic
	kind  string // kafkaTopic, rabbitQueue or natsStreamSubject
	name  string
}

const (
	kafkaTopic        = "kafka topic"
	rabbitQueue       = "rabbitmq queue"
	natsStreamSubject = "nats jetstream subject"
)

// loadConfig loads a configuration with config.Parse, as `delaybridge run`
// does (unknown keys, wrong types and invalid values are errors), with
// exactly env as the environment for ${VAR}. It returns every problem, each
// naming the configuration field.
func loadConfig(data []byte, env map[string]string) (*configFacts, []string) {
	cfg, err := config.Parse(data, func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	if err != nil {
		var ps config.Problems
		if !errors.As(err, &ps) {
			return nil, []string{err.Error()}
		}
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = p.String()
		}
		return nil, out
	}
	f := &configFacts{
		adminListen:     cfg.Admin.Listen,
		adminToken:      cfg.Admin.Token.Reveal() != "",
		shutdownTimeout: cfg.ShutdownTimeout.D(),
		hosts:           map[string]string{},
	}
	hostPort := func(field, addr string) {
		if h, _, err := net.SplitHostPort(addr); err == nil {
			f.hosts[h] = field
		}
	}
	urls := func(field, list string) {
		for _, one := range strings.Split(list, ",") {
			if u, err := url.Parse(strings.TrimSpace(one)); err == nil && u.Hostname() != "" {
				f.hosts[u.Hostname()] = field
			}
		}
	}
	hostPort("redis.addr", cfg.Redis.Addr)
	for i, a := range cfg.Redis.Addrs {
		hostPort(fmt.Sprintf("redis.addrs[%d]", i), a)
	}

	sinks := map[string]config.SinkBroker{}
	for i, s := range cfg.Sinks {
		sinks[s.Name] = s.Broker
		at := fmt.Sprintf("sinks[%d]", i)
		switch b := s.Broker.(type) {
		case *kafkabroker.SinkConfig:
			for j, addr := range b.Brokers {
				hostPort(fmt.Sprintf("%s.kafka.brokers[%d]", at, j), addr)
			}
		case *rabbitbroker.SinkConfig:
			urls(at+".rabbitmq.url", b.URL)
		case *natsbroker.SinkConfig:
			urls(at+".nats.url", b.URL)
		}
	}
	declared := map[string]bool{} // queues a rabbitmq ingest declares itself
	for _, in := range cfg.Ingest {
		if b, ok := in.Broker.(*rabbitbroker.IngestConfig); ok {
			declared[b.Queue] = true
		}
	}
	for i, in := range cfg.Ingest {
		at := fmt.Sprintf("ingest[%d]", i)
		switch b := in.Broker.(type) {
		case *kafkabroker.IngestConfig: // the kafka ingest does not create its topic
			for j, addr := range b.Brokers {
				hostPort(fmt.Sprintf("%s.kafka.brokers[%d]", at, j), addr)
			}
			f.needs = append(f.needs, brokerObject{at + ".kafka.topic", kafkaTopic, b.Topic})
		case *rabbitbroker.IngestConfig:
			urls(at+".rabbitmq.url", b.URL)
		case *natsbroker.IngestConfig: // the nats ingest creates its stream
			urls(at+".nats.url", b.URL)
		}
		dest, field := in.Route.Destination, at+".route.destination"
		switch b := sinks[in.Route.Sink].(type) {
		case *kafkabroker.SinkConfig:
			f.needs = append(f.needs, brokerObject{field, kafkaTopic, dest})
		case *rabbitbroker.SinkConfig:
			if b.Exchange == "" && !declared[dest] {
				// The default exchange routes to the queue named like the key.
				f.needs = append(f.needs, brokerObject{field, rabbitQueue, dest})
			}
		case *natsbroker.SinkConfig:
			if b.JetStream {
				// A JetStream publish needs a stream that takes its subject.
				f.needs = append(f.needs, brokerObject{field, natsStreamSubject, dest})
			}
		}
	}
	return f, nil
}

// runCLI runs the delaybridge command line in-process and returns what it
// printed and its exit code.
func runCLI(args ...string) (string, int) {
	var out bytes.Buffer
	code := cli.Main(args, strings.NewReader(""), &out, &out)
	return out.String(), code
}

// adminGet sends GET path, without a token, to the real admin handler
// configured with a token, and returns the status and body.
func adminGet(path string) (int, string) {
	h := admin.New(admin.Params{Token: "deploy-test-token"}).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}
