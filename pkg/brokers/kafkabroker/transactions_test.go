package kafkabroker

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Records of an aborted transaction are not messages of the topic: a
// read_committed consumer of Kafka's own never sees them, and neither does
// the source. The broker sends them with the list of aborted transactions
// for the client to drop; what was committed, and records written outside
// any transaction, are read in order. (TestCommittedReader has the cases
// kfake does not show.)
func TestSourceSkipsAbortedTransactions(t *testing.T) {
	const topic = "txn"
	k := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	ctx := ctxT(t, 30*time.Second)
	cl := transactional(t, k, topic, "delaybridge-test")
	for _, c := range []struct {
		bodies []string
		commit bool
	}{
		{[]string{"aborted-1", "aborted-2"}, false},
		{[]string{"committed-1"}, true},
		{[]string{"aborted-3"}, false},
		{[]string{"committed-2", "committed-3"}, true},
	} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, b := range c.bodies {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(b)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(c.commit)); err != nil {
			t.Fatal(err)
		}
	}
	produce(t, k.Brokers, kafka.Message{Topic: topic, Value: []byte("plain")})

	s := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	testenv.Eventually(t, 10*time.Second, func() bool { return s.Ready() == nil }, "Ready: %v", s.Ready())
	for _, want := range []string{"committed-1", "committed-2", "committed-3", "plain"} {
		g := readOne(t, s, 15*time.Second)
		if string(g.in.Body) != want {
			t.Fatalf("read %q (%s), want %q: a record of an aborted transaction was read", g.in.Body, g.in.Origin.PositionID(), want)
		}
		if err := g.ack(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
}

// transactional is a franz-go client that writes to topic in
// transactions of its own ID.
func transactional(t *testing.T, k *testenv.KafkaCluster, topic, id string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.TransactionalID(id), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
