package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/brokers"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
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
		Long: `Publishes one message to the broker of an ingest, the way an application would, and prints
its ID and when it is due. Without --id the message gets a generated ID (a UUIDv7), sent as
x-message-id, so that it can be inspected or cancelled by it.

A --delay counts from the message's publish time as the broker records it, as the daemon counts
it: on Kafka the record's timestamp (send sets it) and on JetStream the time the stream stored the
message (send asks the stream), so the due time printed is the one the daemon stores. RabbitMQ and
core NATS record no precise time: the daemon counts from when it reads the message, and send
prints "due about" the time counted from when the broker took the message.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Delay != "" && req.At != "" {
				return exit(2, fmt.Errorf("give --delay or --at, not both: --delay %s counts from now, --at %s names the time", req.Delay, req.At))
			}
			cfg, err := a.load()
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("id") {
				// The daemon would keep it as dead under another ID.
				if reason := envelope.CheckID("--id "+strconv.QuoteToASCII(jsonlimit.Clip(req.ID, 64)), req.ID, cfg.Limits.MaxIDBytes); reason != "" {
					return exit(2, errors.New(reason))
				}
			}
			if req.Ingest == "" {
				return exit(2, fmt.Errorf("--ingest is required: the name of one of the configuration's ingests (%s)", ingestNames(cfg)))
			}
			in := findIngest(cfg, req.Ingest)
			if in == nil {
				return exit(2, fmt.Errorf("no ingest named %q in %s; its ingests: %s", req.Ingest, a.configPath, ingestNames(cfg)))
			}
			for _, h := range headers {
				k, v, ok := strings.Cut(h, "=")
				if !ok || k == "" {
					return exit(2, fmt.Errorf("--header %q: write it as KEY=VALUE", h))
				}
				req.Headers = append(req.Headers, envelope.Header{Key: k, Value: v})
			}
			readsIDs := slices.Contains(in.Dialects, string(envelope.DialectDelaybridge))
			if !readsIDs && (req.Delay != "" || req.At != "" || req.ID != "") {
				// The daemon would keep the message as dead ("x-delay given,
				// but the ingest reads only ...").
				return exit(2, fmt.Errorf("ingest %s reads only the %s dialect, and --delay, --at and --id are the delaybridge dialect's: give its headers instead, e.g. --key ID --header scheduler-epoch=<Unix seconds> --header scheduler-target-topic=TOPIC",
					in.Name, strings.Join(in.Dialects, ", ")))
			}
			if req.ID == "" && readsIDs && !hasHeader(req.Headers, envelope.HeaderMessageID) {
				req.ID = envelope.NewID()
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
			at, err := brokers.Send(ctx, cfg, req)
			if err != nil {
				return exit(1, err)
			}
			due, warning := dueOf(req, in, at, time.Now())
			id := req.ID
			if id == "" {
				id = headerValue(req.Headers, envelope.HeaderMessageID)
			}
			if id == "" {
				id = "a message" // the ingest's dialect names the ID (kafka-scheduler: the record key)
			}
			fmt.Fprintf(a.stdout, "sent %s to ingest %s (%s), %s\n", show(id), req.Ingest, count(len(req.Body), "byte"), due)
			if warning != "" {
				fmt.Fprintln(a.stderr, "delaybridge: warning:", warning)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Ingest, "ingest", "", "name of the ingest to publish to (required)")
	f.StringVar(&req.Delay, "delay", "", "x-delay: milliseconds (5000) or a duration (5s, 1h30m)")
	f.StringVar(&req.At, "at", "", "x-deliver-at: RFC 3339 time or Unix milliseconds")
	f.StringVar(&req.ID, "id", "", "x-message-id: the message's ID (idempotency key; default: a generated UUIDv7)")
	f.StringArrayVar(&headers, "header", nil, "extra header KEY=VALUE (repeatable)")
	f.Var(bytesFlag{&req.Key}, "key", "Kafka ingests: the record key")
	f.StringVar(&req.Subject, "subject", "", "NATS ingests: subject to publish to (default: the ingest's subject with wildcards replaced by \"send\")")
	return cmd
}

func findIngest(cfg *config.Config, name string) *config.Ingest {
	for i := range cfg.Ingest {
		if cfg.Ingest[i].Name == name {
			return &cfg.Ingest[i]
		}
	}
	return nil
}

func ingestNames(cfg *config.Config) string {
	if len(cfg.Ingest) == 0 {
		return "none: add one under ingest:"
	}
	names := make([]string, len(cfg.Ingest))
	for i, in := range cfg.Ingest {
		names[i] = in.Name
	}
	return strings.Join(names, ", ")
}

func hasHeader(hs envelope.Headers, key string) bool {
	for _, h := range hs {
		if strings.EqualFold(h.Key, key) {
			return true
		}
	}
	return false
}

func headerValue(hs envelope.Headers, key string) string {
	for _, h := range hs {
		if strings.EqualFold(h.Key, key) {
			return h.Value
		}
	}
	return ""
}

// dueOf says when the message req is due, as the daemon will read its
// headers, and warns when the daemon will reject it for want of a delay.
// A delay counts from published, the broker's publish time that Send
// returned, as the daemon counts it (brokers.DueAfter); where the broker
// records none (zero) from now, the moment the broker took it: "due about".
func dueOf(req brokers.SendRequest, in *config.Ingest, published, now time.Time) (due, warning string) {
	hs := req.Headers
	delay, at := req.Delay, req.At
	if delay == "" {
		delay = headerValue(hs, envelope.HeaderDelay)
	}
	if at == "" {
		at = headerValue(hs, envelope.HeaderDeliverAt)
	}
	switch {
	case !slices.Contains(in.Dialects, string(envelope.DialectDelaybridge)):
		return fmt.Sprintf("due as its %s headers say", strings.Join(in.Dialects, ", ")), ""
	case hasHeader(hs, envelope.HeaderCancel):
		return "a control message: it cancels " + show(headerValue(hs, envelope.HeaderCancel)), ""
	case hasHeader(hs, envelope.HeaderCancelGroup):
		return "a control message: it cancels group " + show(headerValue(hs, envelope.HeaderCancelGroup)), ""
	case at != "":
		t, reason := envelope.ParseDeliverAt(at)
		if reason != "" {
			return "not due: " + reason, ""
		}
		return "due " + envelope.FormatTime(t) + inWords(t.Sub(now)), ""
	case delay != "":
		d, reason := envelope.ParseDelay(delay)
		if reason != "" {
			return "not due: " + reason, ""
		}
		return dueAfter(published, d, now, ""), ""
	case hasHeader(hs, envelope.HeaderEvery) || hasHeader(hs, envelope.HeaderCron):
		return "recurring: its first occurrence is the schedule's first time", ""
	case in.Route.DefaultDelay != nil:
		return dueAfter(published, in.Route.DefaultDelay.D(), now, "the route's default_delay"), ""
	}
	return "not due", fmt.Sprintf("the message has no --delay or --at, and ingest %s's route has no default_delay: the daemon will keep it as dead (\"no x-delay or x-deliver-at header\"); send it again with --delay D or --at T", in.Name)
}

// dueAfter says "due T (in D)" for a delay d counted from the publish time
// at (brokers.DueAfter), "due about T (in D, ...)" where at is unknown;
// why, when set, says where the delay came from.
func dueAfter(at time.Time, d time.Duration, now time.Time, why string) string {
	due, estimate := brokers.DueAfter(at, d, now)
	var notes []string
	if d > 0 {
		notes = append(notes, "in "+d.Round(time.Millisecond).String())
	} else {
		notes = append(notes, "now: a due time that has passed fires at once")
	}
	if why != "" {
		notes = append(notes, why)
	}
	if estimate {
		notes = append(notes, "counted from when the daemon reads it")
		return "due about " + envelope.FormatTime(due) + " (" + strings.Join(notes, "; ") + ")"
	}
	return "due " + envelope.FormatTime(due) + " (" + strings.Join(notes, "; ") + ")"
}

// inWords is " (in 30m0s)" for a due time ahead, "" for one that has come.
func inWords(d time.Duration) string {
	if d <= 0 {
		return " (now: a due time that has passed fires at once)"
	}
	return " (in " + d.Round(time.Millisecond).String() + ")"
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
