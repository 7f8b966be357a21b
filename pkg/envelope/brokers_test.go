package envelope_test

import (
	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// The tests of package envelope check destinations with the brokers' own
// syntaxes. The broker packages import envelope, so a test of package
// envelope cannot import them; this file, of the external test package,
// gives them before any test runs.
func init() {
	envelope.SyntaxNATS = natsbroker.Destinations
	envelope.SyntaxKafka = kafkabroker.Destinations
	envelope.SyntaxRabbitMQ = rabbitbroker.Destinations
}
