package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/brokers"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

func (a *app) sendCmd() *cobra.Command {
	var (
		req     brokers.SendRequest
		headers []string
	)
	cmd := &cobra.Command{
		Use: "send --ingest NAME [--delay D | --at T] [--id ID] [--header K=V]... [BODY]",
		Example: `  delaybridge send -c config.yaml --ingest orders-in --delay 30m --id order-42 '{"order":42}'
  echo '{"order":42}' | delaybridge send -c config.yaml --ingest orders-in --at 2026-12-24T18:00:00Z --header x-delay-group=order-42 -`,
		Short: "Publish one message with delay headers to an ingest's topic (body from stdin when BODY is - or absent)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := a.load()
			if err != nil {
				return err
			}
			if req.Ingest == "" {
				return exit(2, fmt.Errorf("--ingest is required"))
			}
			if req.ID != "" {
				// The daemon would keep it as dead under another ID.
				if err := checkIDs(req.ID); err != nil {
					return err
				}
			}
			for _, h := range headers {
				k, v, ok := strings.Cut(h, "=")
				if !ok || k == "" {
					return exit(2, fmt.Errorf("--header %q: write it as KEY=VALUE", h))
				}
				req.Headers = append(req.Headers, envelope.Header{Key: k, Value: v})
			}
			if len(args) == 0 || args[0] == "-" {
				body, err := io.ReadAll(a.stdin)
				if err != nil {
					return exit(1, fmt.Errorf("read body from stdin: %w", err))
				}
				req.Body = body
			} else {
				req.Body = []byte(args[0])
			}
			ctx, stop := signalCtx(cmd)
			defer stop()
			if err := brokers.Send(ctx, cfg, req); err != nil {
				return exit(1, err)
			}
			fmt.Fprintf(a.stdout, "sent %d bytes to ingest %s\n", len(req.Body), req.Ingest)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Ingest, "ingest", "", "name of the ingest to publish to (required)")
	f.StringVar(&req.Delay, "delay", "", "x-delay: milliseconds (5000) or a duration (5s, 1h30m)")
	f.StringVar(&req.At, "at", "", "x-deliver-at: RFC 3339 time or Unix milliseconds")
	f.StringVar(&req.ID, "id", "", "x-message-id: the message's ID (idempotency key)")
	f.StringArrayVar(&headers, "header", nil, "extra header KEY=VALUE (repeatable)")
	f.Var(bytesFlag{&req.Key}, "key", "Kafka ingests: the record key")
	f.StringVar(&req.Subject, "subject", "", "NATS ingests: subject to publish to (default: the ingest's subject with wildcards replaced by \"send\")")
	cmd.MarkFlagsMutuallyExclusive("delay", "at")
	return cmd
}

// bytesFlag is a string flag stored as bytes (nil when not given).
type bytesFlag struct{ p *[]byte }

func (f bytesFlag) String() string {
	if f.p == nil {
		return ""
	}
	return string(*f.p)
}
func (f bytesFlag) Set(v string) error { *f.p = []byte(v); return nil }
func (f bytesFlag) Type() string       { return "string" }
