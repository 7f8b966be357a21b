package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// The topic watcher: every generation reads how many partitions the topic
// has and ends the generation (the group rebalances) when that is no
// longer what the group's assignment was made from: the topic was deleted,
// created (again), or given partitions.
//
// It replaces kafka-go's own (ConsumerGroupConfig.WatchPartitionChanges),
// which had two faults when the topic is deleted and created again:
//
//   - It compares with what it reads itself when the generation has begun,
//     not with what the leader assigned: a topic created in between (after
//     the leader found it missing and assigned nothing) looked unchanged,
//     and the group stayed without partitions for good.
//   - It ends a generation at once when it cannot read the topic as it
//     begins, so while the topic was missing the group rebalanced as fast
//     as it could join (thousands of generations a second).
//
// Here the group's leader compares with the partitions it assigned
// (leadBalancer records them), the other members with what they read
// first; while the topic is missing a generation lasts, with nothing
// assigned, and Ready says why nothing is read.

// topicWatchInterval is how often a generation reads the topic's
// partitions: a topic created again is read within about this long.
const topicWatchInterval = time.Second

// topicWatchWarnAfter is how many reads in a row must fail before the
// watcher says so at WARN.
const topicWatchWarnAfter = 10

// leadBalancer is a kafka.GroupBalancer that records, in from, how many
// partitions of topic the assignment it makes is made from. kafka-go calls
// it on the group's leader only, while joining the generation that Next
// returns next.
type leadBalancer struct {
	kafka.GroupBalancer
	topic string
	from  *assignedFrom
}

func (b leadBalancer) AssignGroups(members []kafka.GroupMember, partitions []kafka.Partition) kafka.GroupMemberAssignments {
	n := 0
	for _, p := range partitions {
		if p.Topic == b.topic {
			n++
		}
	}
	b.from.set(n)
	return b.GroupBalancer.AssignGroups(members, partitions)
}

// leadBalancers wraps kafka-go's default balancers (the same protocol
// names, so members of earlier releases still agree on one).
func leadBalancers(topic string, from *assignedFrom) []kafka.GroupBalancer {
	return []kafka.GroupBalancer{
		leadBalancer{kafka.RangeGroupBalancer{}, topic, from},
		leadBalancer{kafka.RoundRobinGroupBalancer{}, topic, from},
	}
}

// assignedFrom is the number of partitions the last assignment this member
// made as the leader was made from, until the generation loop takes it.
type assignedFrom struct {
	mu sync.Mutex
	n  int
	ok bool // n is set
}

func (a *assignedFrom) set(n int) {
	a.mu.Lock()
	a.n, a.ok = n, true
	a.mu.Unlock()
}

// take returns the recorded number and forgets it; -1 when this member
// made no assignment since the last take (it is not the leader).
func (a *assignedFrom) take() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.n, a.ok
	a.n, a.ok = 0, false
	if !ok {
		return -1
	}
	return n
}

// watchTopic reads the topic's partitions every topicWatchInterval and
// returns, which ends the generation, when their number is not the one
// the assignment was made from (g.from; what it reads first when that is
// not known). It logs, and Ready reports, the topic missing and back.
func (g *generation) watchTopic(ctx context.Context) {
	s := g.src
	from := g.from
	var conn *kafka.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	failures, zeros := 0, 0
	for {
		n, err := s.topicPartitions(ctx, &conn)
		if err == nil && n == 0 {
			// Missing: believed at the second read in a row, not at one
			// answer of a broker whose metadata lags.
			if zeros++; zeros < 2 {
				err = errors.New("the topic is missing at one read")
			}
		} else if err == nil {
			zeros = 0
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// Not a change: the coordinator's heartbeats tell whether the
			// group is still there. Said once the reads fail for a while
			// (an ACL without Describe, a broker gone): meanwhile a change
			// of the topic goes unseen.
			failures++
			s.log.Debug("kafka: cannot read the topic's partitions; retrying", "err", err)
			if failures == topicWatchWarnAfter {
				s.log.Warn("kafka: cannot read the topic's partitions; a topic deleted, created again or given partitions is not noticed until it can",
					"topic", s.cfg.Topic, "failures", failures, "err", err)
			}
		default:
			if failures >= topicWatchWarnAfter {
				s.log.Info("kafka: the topic's partitions can be read again", "topic", s.cfg.Topic)
			}
			failures = 0
			s.setTopicMissing(n == 0)
			if from < 0 {
				from = n
			}
			if n != from {
				s.log.Info("kafka: the topic's partitions changed; rejoining the consumer group",
					"generation", g.kg.ID, "partitions", n, "assigned_from", from)
				return
			}
		}
		if !sleep(ctx, topicWatchInterval) {
			return
		}
	}
}

// topicPartitions returns how many partitions the topic has, 0 when it
// does not exist, over *conn (dialled when nil, and closed and set to nil
// after a failure of the connection).
func (s *Source) topicPartitions(ctx context.Context, conn **kafka.Conn) (int, error) {
	if *conn == nil {
		var err error
		for _, b := range s.cfg.Brokers {
			if *conn, err = s.dialer.DialContext(ctx, "tcp", b); err == nil {
				break
			}
		}
		if err != nil {
			return 0, err
		}
	}
	c := *conn
	_ = c.SetDeadline(time.Now().Add(checkTopicTimeout))
	stop := context.AfterFunc(ctx, func() { c.Close() })
	parts, err := c.ReadPartitions(s.cfg.Topic)
	stop()
	if errors.Is(err, kafka.UnknownTopicOrPartition) {
		return 0, nil
	}
	if err != nil {
		var kerr kafka.Error
		if !errors.As(err, &kerr) { // not the broker's answer: the connection's
			c.Close()
			*conn = nil
		}
		return 0, err
	}
	return len(parts), nil
}

// setTopicMissing records whether the topic exists, and logs when that
// changes (not every generation).
func (s *Source) setTopicMissing(missing bool) {
	s.mu.Lock()
	was := s.topicMissing
	s.topicMissing = missing
	s.wasMissing = s.wasMissing || missing
	s.mu.Unlock()
	switch {
	case missing && !was:
		s.log.Warn("kafka: topic " + s.cfg.Topic + " does not exist (deleted?); nothing is read until it is created again")
	case !missing && was:
		s.log.Info("kafka: topic " + s.cfg.Topic + " exists again; reading it from its oldest record")
	}
}

// errTopicMissing is Ready's error while the topic does not exist.
func (s *Source) errTopicMissing() error {
	return fmt.Errorf("kafka: topic %q does not exist (deleted?); nothing is read until it is created again", s.cfg.Topic)
}
