package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The schedule operations: list, reschedule, fire, groups, sinks. Like
// inspect and cancel they act on Redis (-c FILE) or through a daemon
// (--admin URL), with the operations of pkg/ops (withOps).

// listFlags are the filters of list and groups show.
type listFlags struct {
	state, dueAfter, dueBefore        string
	sink, destination, ingest, cursor string
	recurring, all, asJSON, body      bool
	limit                             int
}

func (f *listFlags) register(cmd *cobra.Command, group bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.state, "state", "", "scheduled, held, inflight or dead (default: all but dead); held: waiting for a paused or down sink; dead lists by time of death")
	fl.StringVar(&f.dueAfter, "due-after", "", "only messages due at or after this time (RFC 3339 or Unix ms)")
	fl.StringVar(&f.dueBefore, "due-before", "", "only messages due before this time (RFC 3339 or Unix ms)")
	fl.StringVar(&f.sink, "sink", "", "only messages to this sink")
	fl.StringVar(&f.destination, "destination", "", "only messages to this destination")
	fl.StringVar(&f.ingest, "ingest", "", "only messages from this ingest")
	fl.BoolVar(&f.recurring, "recurring", false, "only recurring messages")
	fl.IntVar(&f.limit, "limit", store.DefaultBrowseLimit, fmt.Sprintf("messages per page (at most %d)", store.MaxBrowseLimit))
	fl.StringVar(&f.cursor, "cursor", "", "continue a listing where a page ended (its next cursor)")
	fl.BoolVar(&f.all, "all", false, "follow the cursor to the end (with --json: one message per line)")
	fl.BoolVar(&f.asJSON, "json", false, "print JSON")
	if !group {
		fl.BoolVar(&f.body, "body", false, "include key, headers and body (through --admin: only when the daemon has admin.token)")
	}
}

// emptyFilters refuses a string flag of cmd's own given an empty value
// (--group ""): read as no filter it would select every message
// (ops.EmptyFilter), exit 2 as any invalid request.
func emptyFilters(cmd *cobra.Command) error {
	var err error
	cmd.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
		if err == nil && f.Changed && f.Value.Type() == "string" && f.Value.String() == "" {
			err = failed(ops.EmptyFilter("--" + f.Name))
		}
	})
	return err
}

// query builds the listing's query from the flags (group set by the
// caller); the operation checks it.
func (f *listFlags) query() ops.ListQuery {
	return ops.ListQuery{State: f.state, DueAfter: f.dueAfter, DueBefore: f.dueBefore, Sink: f.sink, Destination: f.destination,
		Ingest: f.ingest, Recurring: f.recurring, Limit: &f.limit, Cursor: f.cursor, Content: f.body}
}

// printPages prints what page returns for q, following the cursor with
// --all; without it, a next cursor is printed after the table (to stderr,
// so that the table can be piped).
func (a *app) printPages(f *listFlags, q ops.ListQuery, page func(q ops.ListQuery) (*ops.ListView, error), head func(v *ops.ListView)) error {
	for first := true; ; first = false {
		v, err := page(q)
		if err != nil {
			return failed(err)
		}
		switch {
		case f.asJSON && !f.all:
			return a.printJSON(v)
		case f.asJSON:
			for _, m := range v.Messages {
				if err := admin.EncodeJSON(a.stdout, m, ""); err != nil {
					return err
				}
			}
		default:
			if first && head != nil {
				head(v)
			}
			printMessages(a.stdout, v.Messages, first)
		}
		if v.NextCursor == nil {
			return nil
		}
		if !f.all {
			if !f.asJSON {
				fmt.Fprintf(a.stderr, "more: --cursor %s\n", *v.NextCursor)
			}
			return nil
		}
		q.Cursor = *v.NextCursor
	}
}

// printMessages prints a table of messages.
func printMessages(w io.Writer, ms []ops.MessageView, header bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "ID\tSTATE\tDUE AT\tNEXT\tROUTE\tGROUP\tSCHEDULE\tPRIORITY\tATTEMPTS")
	}
	for _, m := range ms {
		state := m.State
		if m.Held && state != store.StateHeld {
			state += " (held)"
		}
		next := m.NextAttemptAt
		if m.State == store.StateDead {
			next = "died " + m.DeadAt
		}
		schedule := ""
		if r := m.Recurrence; r != nil {
			schedule = fmt.Sprintf("#%d %s", r.Occurrence, r.Schedule)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", show(m.ID), state, m.DueAt, next,
			show(m.Sink+" -> "+m.Destination), show(m.Group), show(schedule), m.Priority, m.Attempts)
	}
	_ = tw.Flush()
}

func (a *app) listCmd() *cobra.Command {
	var f listFlags
	var group string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List parked (or dead) messages in the order they fire, a page at a time",
		Long: `List parked messages in the order they fire, across every shard: due time, then ID
(held messages at their due times; in-flight ones at their lease expiry). --state dead lists
the dead messages by time of death. Filters on sink, destination, ingest, group or
--recurring examine a bounded number of messages per page: a page may then be short, even
empty, and still continue (--cursor, or --all).`,
		Example: `  delaybridge list -c config.yaml --limit 20
  delaybridge list -c config.yaml --sink rabbit --due-before 2026-12-01T00:00:00Z --all
  delaybridge list --admin http://127.0.0.1:7070 --state dead --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := emptyFilters(cmd); err != nil {
				return err
			}
			q := f.query()
			q.Group = group
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				return a.printPages(&f, q, func(q ops.ListQuery) (*ops.ListView, error) { return o.List(ctx, q) }, nil)
			})
		},
	}
	f.register(cmd, false)
	cmd.Flags().StringVar(&group, "group", "", "only messages of this group (x-delay-group)")
	return cmd
}

func (a *app) rescheduleCmd() *cobra.Command {
	var delay, at, ifDueAt string
	cmd := &cobra.Command{
		Use:   "reschedule ID (--delay D | --at T)",
		Short: "Give a scheduled message a new due time; a time that has passed fires it now",
		Long: `Give a scheduled message a new due time, as a delay from now (milliseconds or a Go
duration) or a time (RFC 3339 or Unix ms), by the rules of x-delay and x-deliver-at; beyond
limits.max_delay is refused. With --if-due-at the change is made only if the message is
still due then (compare and set). Exit 1 if the message is unknown, in flight, dead, or
was changed meanwhile.`,
		Example: `  delaybridge reschedule -c config.yaml order-42 --delay 2h
  delaybridge reschedule -c config.yaml order-42 --at 2026-12-01T10:00:00Z --if-due-at 2026-11-30T10:00:00Z`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIDs(args...); err != nil {
				return err
			}
			if (delay == "") == (at == "") {
				return exit(2, errors.New("give either --delay or --at"))
			}
			var r ops.RescheduleRequest
			for _, f := range []struct {
				v   string
				dst *ops.Scalar
			}{{delay, &r.Delay}, {at, &r.DeliverAt}, {ifDueAt, &r.IfDueAt}} {
				if f.v != "" {
					*f.dst = ops.Text(f.v)
				}
			}
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				v, err := o.Reschedule(ctx, args[0], r)
				if err != nil {
					return failed(err)
				}
				if v.Now {
					fmt.Fprintf(a.stdout, "rescheduled %s: due now (%s)\n", show(args[0]), v.DueAt)
				} else {
					fmt.Fprintf(a.stdout, "rescheduled %s: due at %s\n", show(args[0]), v.DueAt)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&delay, "delay", "", "new due time as a delay from now: milliseconds (5000) or a duration (90s, 2h)")
	cmd.Flags().StringVar(&at, "at", "", "new due time: RFC 3339 (2026-12-01T10:00:00Z) or Unix ms")
	cmd.Flags().StringVar(&ifDueAt, "if-due-at", "", "only if the message is due at this time now (as inspect shows due_at)")
	return cmd
}

func (a *app) fireCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "fire ID",
		Short: "Make a scheduled message due now; exit 1 if unknown, in flight or dead",
		Long: `Make a scheduled message due now. A message held for its sink (paused or down) stays
held, due now: it fires when the sink takes messages again.`,
		Example: `  delaybridge fire -c config.yaml order-42
  delaybridge fire --admin http://127.0.0.1:7070 order-42`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIDs(args...); err != nil {
				return err
			}
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				if err := o.Fire(ctx, args[0]); err != nil {
					return failed(err)
				}
				fmt.Fprintf(a.stdout, "fired %s: due now\n", show(args[0]))
				return nil
			})
		},
	}
}

func (a *app) groupsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "groups",
		Short: "Show or cancel the messages of a group (x-delay-group)",
	}
	var f listFlags
	showCmd := &cobra.Command{
		Use:   "show KEY",
		Short: "Show how many messages a group has and list them in the order they fire; exit 1 if none",
		Example: `  delaybridge groups show -c config.yaml order-42
  delaybridge groups show --admin http://127.0.0.1:7070 order-42 --all --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if reason := envelope.CheckID("the group "+strconv.QuoteToASCII(jsonlimit.Clip(key, 64)), key, 0); reason != "" {
				return exit(2, errors.New(reason))
			}
			if err := emptyFilters(cmd); err != nil {
				return err
			}
			q := f.query()
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				var count int64
				page := func(q ops.ListQuery) (*ops.ListView, error) {
					v, err := o.Group(ctx, key, q)
					if err != nil {
						return nil, err
					}
					count = v.Count
					return &v.ListView, nil
				}
				head := func(*ops.ListView) {
					fmt.Fprintf(a.stdout, "group %s: %d messages (parked, in flight and dead)\n", show(key), count)
				}
				return a.printPages(&f, q, page, head)
			})
		},
	}
	f.register(showCmd, true)
	cancel := &cobra.Command{
		Use:   "cancel KEY",
		Short: "Cancel every message of a group; exit 1 if it has none",
		Long: `Cancel every parked, in-flight and dead message filed under the group, on every shard.
A message already being published may still be published once; one parked into the group
while it is cancelled is either cancelled or kept whole.`,
		Example: `  delaybridge groups cancel -c config.yaml order-42`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if reason := envelope.CheckID("the group "+strconv.QuoteToASCII(jsonlimit.Clip(key, 64)), key, 0); reason != "" {
				return exit(2, errors.New(reason))
			}
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				v, err := o.CancelGroup(ctx, key)
				if err != nil {
					return failed(err)
				}
				fmt.Fprintf(a.stdout, "cancelled %d messages of group %s\n", v.Cancelled, show(key))
				if v.InFlight > 0 {
					fmt.Fprintf(a.stdout, "%d more being published now may each be delivered; a series among them ends with that occurrence; another whose publish fails stays parked: cancel the group again\n", v.InFlight)
				}
				return nil
			})
		},
	}
	cmd.AddCommand(showCmd, cancel)
	return cmd
}

func (a *app) sinksCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "sinks",
		Short: "List the sinks: ready, paused, held due messages, rate; pause or resume one",
		Long: `List the configured sinks. Through --admin the daemon says whether it is connected to each
and its publish rate; through Redis (-c) only the pause and the held messages are known.
DUE counts the sink's due messages held while it is paused or down.`,
		Example: `  delaybridge sinks -c config.yaml
  delaybridge sinks --admin http://127.0.0.1:7070 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				views, err := o.Sinks(ctx)
				if err != nil {
					return failed(err)
				}
				if asJSON {
					return a.printJSON(views)
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSTATUS\tREADY\tPAUSED\tDUE\tRATE/S\tMAX RATE/S\tERROR")
				unknown := false
				for _, v := range views {
					ready, rate := "?", "?"
					if v.Ready != nil {
						ready = strconv.FormatBool(*v.Ready)
					}
					if v.Rate != nil {
						rate = strconv.FormatFloat(*v.Rate, 'f', 1, 64)
					}
					maxRate := "-"
					if v.MaxRate > 0 {
						maxRate = strconv.FormatFloat(v.MaxRate, 'f', -1, 64)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%d\t%s\t%s\t%s\n", show(v.Name), v.Status, ready, v.Paused, v.Due, rate, maxRate, show(v.Error))
					unknown = unknown || v.Status == "unknown"
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if unknown {
					fmt.Fprintln(a.stdout, "unknown, ?: read from Redis, which does not know whether a daemon reaches the sink or how fast it publishes; ask a running daemon with --admin URL")
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	pause := func(paused bool) *cobra.Command {
		verb, done, example := "resume", "resumed", "resume"
		short := "Resume firing to a sink, for every instance: its held messages fire by priority, then in due order, within each shard"
		if paused {
			verb, done, example = "pause", "paused", "pause"
			short = "Stop firing to a sink, for every instance and across restarts: its due messages are held"
		}
		return &cobra.Command{
			Use:     verb + " NAME",
			Short:   short,
			Example: fmt.Sprintf("  delaybridge sinks %s -c config.yaml rabbit\n  delaybridge sinks %s --admin http://127.0.0.1:7070 rabbit", example, example),
			Args:    cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
					v, err := o.SetPaused(ctx, args[0], paused)
					if err != nil {
						return failed(err)
					}
					switch {
					case paused && (v.Status == "pausing" || !viaAdmin(o)):
						// A daemon that has not applied it yet, or through Redis.
						fmt.Fprintf(a.stdout, "%s %s for every instance (due messages held: %d); running daemons hold its messages from their next refresh (within scheduler.max_sleep), and may publish some until then\n", done, show(v.Name), v.Due)
					case paused:
						fmt.Fprintf(a.stdout, "%s %s for every instance (due messages held: %d); the daemon asked holds its messages now, any other from its next refresh (within scheduler.max_sleep)\n", done, show(v.Name), v.Due)
					case v.Released == 0:
						fmt.Fprintf(a.stdout, "%s %s for every instance (no messages were held)\n", done, show(v.Name))
					case v.Status == "unknown" || v.Status == "resuming":
						// Through Redis, or a daemon that has not applied it yet.
						fmt.Fprintf(a.stdout, "%s %s for every instance: %s released, to fire by priority, then in due order, within each shard at the daemons' next refresh (within scheduler.max_sleep)\n",
							done, show(v.Name), count(int(v.Released), "held message"))
					default:
						fmt.Fprintf(a.stdout, "%s %s for every instance: %s released, firing by priority, then in due order\n", done, show(v.Name), count(int(v.Released), "held message"))
					}
					return nil
				})
			},
		}
	}
	cmd.AddCommand(pause(true), pause(false))
	return cmd
}
