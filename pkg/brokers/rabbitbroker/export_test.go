package rabbitbroker

import amqp "github.com/rabbitmq/amqp091-go"

// For the tests of package rabbitbroker_test.
var (
	SameField          = sameField
	EveryFieldType     = everyFieldType
	PublishCloseReason = closeReason
	KeepSent           = keepSent
	Silent             = silent
)

// MaxLanes is how many destinations get a connection apart of their own.
const MaxLanes = maxLanes

// Block tells s what the broker's connection.blocked (active) or
// connection.unblocked says.
func (s *Sink) Block(active bool, reason string) {
	s.setBlocked(amqp.Blocking{Active: active, Reason: reason})
}
