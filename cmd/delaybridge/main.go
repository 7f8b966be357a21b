// Command delaybridge relays delayed messages: it reads them from Kafka,
// RabbitMQ or NATS, parks them in Redis until they are due, and publishes
// them to a sink. `delaybridge --help` lists the commands.
package main

import (
	"os"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
