package testenv

import (
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

type kafkaConfig struct {
	brokers int
	topics  []kafkaTopic
	persist bool
	extra   []kfake.Opt
}

type kafkaTopic struct {
	name       string
	partitions int
}

// KafkaOption configures Kafka.
type KafkaOption func(*kafkaConfig)

// WithTopic creates topic with the given number of partitions at start.
func WithTopic(topic string, partitions int) KafkaOption {
	return func(c *kafkaConfig) { c.topics = append(c.topics, kafkaTopic{topic, partitions}) }
}

// WithBrokers sets the number of brokers (default 3).
func WithBrokers(n int) KafkaOption {
	return func(c *kafkaConfig) { c.brokers = n }
}

// WithoutPersistence keeps the cluster's state in memory only (no kfake.DataDir).
// Restart then loses every topic, record and committed offset.
func WithoutPersistence() KafkaOption {
	return func(c *kafkaConfig) { c.persist = false }
}

// WithKfakeOpts passes extra kfake options, e.g. kfake.AllowAutoTopicCreation() or
// kfake.SyncWrites(). Do not pass NumBrokers, Ports or DataDir: Kafka sets them.
func WithKfakeOpts(opts ...kfake.Opt) KafkaOption {
	return func(c *kafkaConfig) { c.extra = append(c.extra, opts...) }
}

// KafkaCluster is an in-process kfake cluster speaking the Kafka protocol on loopback.
type KafkaCluster struct {
	Brokers []string // "127.0.0.1:PORT" of every broker
	DataDir string   // kfake.DataDir, "" with WithoutPersistence

	mu      sync.Mutex
	Cluster *kfake.Cluster // the current cluster; replaced by Restart

	t     testing.TB
	ports []int
	opts  []kfake.Opt
}

// Kafka starts an in-process kfake cluster: 3 brokers on reserved 127.0.0.1 ports,
// GroupMinSessionTimeout lowered to 1 s (kfake's default minimum is 6 s), state
// persisted to a t.TempDir() so that Restart keeps topics, records and committed
// offsets; topics given WithTopic are created. Closed in t.Cleanup. Ready in a few ms.
//
// Caveats: auto topic creation is off (WithKfakeOpts(
// kfake.AllowAutoTopicCreation()) turns it on); kafka-go's default consumer-group
// session timeout is 30 s, so a crashed member's partitions wait that long unless the
// reader sets a shorter SessionTimeout (>= 1 s here); kafka-go's Writer needs
// RequiredAcks: kafka.RequireAll and a small BatchTimeout to be useful in tests.
// kfake is not a real broker: it has no replication and its own scheduling, so it
// proves protocol-level behaviour, not Kafka's durability.
func Kafka(t testing.TB, opts ...KafkaOption) *KafkaCluster {
	skipShort(t, "a Kafka cluster")
	t.Helper()
	cfg := kafkaConfig{brokers: 3, persist: true}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.brokers < 1 {
		t.Fatalf("testenv.Kafka: need at least 1 broker, got %d", cfg.brokers)
	}
	k := &KafkaCluster{t: t}
	for i := 0; i < cfg.brokers; i++ {
		k.ports = append(k.ports, reservePorts(t, portLo, portHi))
	}
	k.opts = []kfake.Opt{
		kfake.NumBrokers(cfg.brokers),
		kfake.Ports(k.ports...),
		kfake.GroupMinSessionTimeout(time.Second),
	}
	if cfg.persist {
		k.DataDir = t.TempDir()
		k.opts = append(k.opts, kfake.DataDir(k.DataDir))
	}
	k.opts = append(k.opts, cfg.extra...)
	t.Cleanup(k.Close)
	k.start()
	for _, tp := range cfg.topics {
		k.CreateTopic(t, tp.name, tp.partitions)
	}
	return k
}

func (k *KafkaCluster) start() {
	k.t.Helper()
	c, err := kfake.NewCluster(k.opts...)
	if err != nil {
		k.t.Fatalf("testenv: kfake.NewCluster on ports %v: %v", k.ports, err)
	}
	k.mu.Lock()
	k.Cluster = c
	k.Brokers = c.ListenAddrs()
	k.mu.Unlock()
}

// CreateTopic creates topic with the given partitions (kfake's default replication)
// through kfake's API; it is visible to clients at once. It fails the test on error,
// e.g. if the topic exists.
func (k *KafkaCluster) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	k.mu.Lock()
	c := k.Cluster
	k.mu.Unlock()
	if c == nil {
		t.Fatalf("testenv: CreateTopic %q on a closed kfake cluster", topic)
	}
	if err := c.CreateTopic(topic, int32(partitions), nil); err != nil {
		t.Fatalf("testenv: create topic %q (%d partitions): %v", topic, partitions, err)
	}
}

// Close shuts the cluster down; with persistence it first saves its state to DataDir.
// Clients see their connections closed. No-op if already closed.
func (k *KafkaCluster) Close() {
	k.mu.Lock()
	c := k.Cluster
	k.Cluster = nil
	k.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Restart closes the cluster (if open) and starts a new one on the same ports and
// DataDir: topics, records and committed group offsets survive (unless the cluster
// was made WithoutPersistence); group membership does not, so consumer-group clients
// rejoin. k.Cluster refers to the new cluster afterwards.
func (k *KafkaCluster) Restart() {
	k.t.Helper()
	k.Close()
	k.start()
}
