package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
	"github.com/delaybridge/delaybridge/pkg/ops"
)

// printJSON prints v as indented JSON, with the characters that could
// make one ID look like another escaped (admin.EncodeJSON).
func (a *app) printJSON(v any) error { return admin.EncodeJSON(a.stdout, v, "  ") }

// show is a value from Redis or the API as printed in text: an ID (or a
// reason) stored before such characters were refused is shown with them
// escaped, and a tab or newline cannot break a table's columns.
func show(s string) string { return envelope.DisplayID(s) }

// checkIDs refuses, before anything is done, an ID argument that no
// message can have (envelope.CheckID: the rule of every other path).
func checkIDs(ids ...string) error {
	for _, id := range ids {
		if reason := envelope.CheckID("the ID "+strconv.QuoteToASCII(jsonlimit.Clip(id, 64)), id, 0); reason != "" {
			return exit(2, errors.New(reason))
		}
	}
	return nil
}

func (a *app) inspectCmd() *cobra.Command {
	var body bool
	cmd := &cobra.Command{
		Use: "inspect ID",
		Example: `  delaybridge inspect -c config.yaml order-42
  delaybridge inspect --admin http://127.0.0.1:7070 --token "$TOKEN" --body order-42`,
		Short: "Print a parked or dead message's state as JSON; exit 1 if unknown",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIDs(args...); err != nil {
				return err
			}
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				v, err := o.Inspect(ctx, args[0], body)
				if err != nil {
					return failed(err)
				}
				if err := a.printJSON(v); err != nil {
					return err
				}
				if body && v.DecodeError != "" {
					// The content asked for cannot be shown: say so in the status too.
					return exit(1, fmt.Errorf("the content of %s cannot be read: %s", show(args[0]), v.DecodeError))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&body, "body", false, "include the content: key, headers and body (through --admin: only when the daemon has admin.token)")
	return cmd
}

func (a *app) cancelCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "cancel ID",
		Example: `  delaybridge cancel -c config.yaml order-42`,
		Short:   "Cancel a parked message (or delete a dead one) so that it is never published; exit 1 if unknown or being published",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIDs(args...); err != nil {
				return err
			}
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				if err := o.Cancel(ctx, args[0]); err != nil {
					return failed(err)
				}
				fmt.Fprintf(a.stdout, "cancelled %s\n", show(args[0]))
				return nil
			})
		},
	}
}

func (a *app) statsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "stats",
		Example: `  delaybridge stats -c config.yaml`,
		Short:   "Print how many messages are parked, due and dead, per shard",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				v, err := o.Stats(ctx)
				if err != nil {
					return failed(err)
				}
				if v.Warning != "" {
					fmt.Fprintln(a.stderr, "warning:", v.Warning)
				}
				if asJSON {
					return a.printJSON(v)
				}
				fmt.Fprintf(a.stdout, "parked %d  due %d  dead %d  oldest due waiting %.3fs\n", v.Parked, v.Due, v.Dead, v.OldestDueAgeSeconds)
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
				fmt.Fprintln(tw, "shard\tparked\tdue\tdead\t")
				for _, sh := range v.Shards {
					fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t\n", sh.Shard, sh.Parked, sh.Due, sh.Dead)
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// deadFlags are the filters of dead list and dead purge.
type deadFlags struct{ f ops.DeadFilter }

func (d *deadFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&d.f.Sink, "sink", "", "only dead messages to this sink")
	fl.StringVar(&d.f.Destination, "destination", "", "only dead messages to this destination")
	fl.StringVar(&d.f.Ingest, "ingest", "", "only dead messages from this ingest")
	fl.StringVar(&d.f.Group, "group", "", "only dead messages of this group (x-delay-group)")
	fl.StringVar(&d.f.DeadAfter, "dead-after", "", "only messages that died at or after this time (RFC 3339 or Unix ms)")
	fl.StringVar(&d.f.DeadBefore, "dead-before", "", "only messages that died before this time (RFC 3339 or Unix ms)")
}

func (a *app) deadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "dead",
		Example: `  delaybridge dead list -c config.yaml
  delaybridge dead retry -c config.yaml order-42`,
		Short: "List, retry or purge dead messages",
	}
	var (
		asJSON bool
		limit  int
		listF  deadFlags
	)
	list := &cobra.Command{
		Use: "list",
		Example: `  delaybridge dead list -c config.yaml --limit 20
  delaybridge dead list --admin http://127.0.0.1:7070 --sink rabbit --json`,
		Short: "List dead messages with their reasons, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := emptyFilters(cmd); err != nil {
				return err
			}
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				views, err := o.ListDead(ctx, ops.DeadQuery{DeadFilter: listF.f, Limit: &limit})
				if err != nil {
					return failed(err)
				}
				if asJSON {
					return a.printJSON(views)
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tDEAD AT\tATTEMPTS\tSINK\tDESTINATION\tREASON")
				for _, v := range views {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", show(v.ID), v.DeadAt, v.Attempts, show(v.Sink), show(v.Destination), show(v.Reason))
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	list.Flags().IntVar(&limit, "limit", ops.DefaultDeadLimit, fmt.Sprintf("at most this many (at most %d)", ops.MaxDeadLimit))
	listF.register(list)

	var to ops.RetryRequest
	retry := &cobra.Command{
		Use: "retry ID...",
		Example: `  delaybridge dead retry -c config.yaml order-42 order-43
  delaybridge dead retry -c config.yaml order-44 --destination orders.expired`,
		Short: "Schedule dead messages again, due now; exit 1 if one is not dead or cannot be retried",
		Long: `Schedule dead messages again, due now, through the rules a message meets at ingest. A
message that died for its sink or destination (not configured, refused by the broker, not a
valid destination) is retried only with --sink or --destination naming a valid one.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIDs(args...); err != nil {
				return err
			}
			if err := emptyFilters(cmd); err != nil {
				return err
			}
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				var refused error
				for _, id := range args {
					err := o.RetryDead(ctx, id, to)
					switch {
					case errors.Is(err, ops.ErrNotFound), errors.Is(err, ops.ErrConflict):
						// Said once here, for each ID; the exit says nothing more.
						refused = exit(1, nil)
						fmt.Fprintf(a.stderr, "delaybridge: not retried: %s\n", err)
					case err != nil:
						return failed(err)
					default:
						fmt.Fprintf(a.stdout, "scheduled again: %s\n", show(id))
					}
				}
				return refused
			})
		},
	}
	retry.Flags().StringVar(&to.Sink, "sink", "", "publish to this sink instead of the message's")
	retry.Flags().StringVar(&to.Destination, "destination", "", "publish to this destination instead of the message's")

	var purgeF deadFlags
	purge := &cobra.Command{
		Use: "purge",
		Example: `  delaybridge dead purge -c config.yaml
  delaybridge dead purge --admin http://127.0.0.1:7070 --ingest orders-in --dead-before 2026-12-01T00:00:00Z`,
		Short: "Delete every dead message (or those the filters select), in one request",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := emptyFilters(cmd); err != nil {
				return err
			}
			return a.withOps(cmd, func(ctx context.Context, o ops.Operations) error {
				v, err := o.PurgeDead(ctx, purgeF.f)
				if err != nil {
					return failed(err)
				}
				fmt.Fprintf(a.stdout, "deleted %d dead messages\n", v.Deleted)
				return nil
			})
		},
	}
	purgeF.register(purge)
	cmd.AddCommand(list, retry, purge)
	return cmd
}
