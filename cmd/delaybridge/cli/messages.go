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
		if reason := envelope.CheckID("the ID "+strconv.QuoteToASCII(id), id, 0); reason != "" {
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
			return a.withBackend(cmd, func(ctx context.Context, b backend) error {
				v, err := b.Inspect(ctx, args[0], body)
				if errors.Is(err, errNotFound) {
					return exit(1, fmt.Errorf("no message with ID %q is parked or dead", args[0]))
				}
				if err != nil {
					return exit(1, err)
				}
				return a.printJSON(v)
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
		Short:   "Cancel a parked message (or delete a dead one); exit 1 if unknown",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIDs(args...); err != nil {
				return err
			}
			return a.withBackend(cmd, func(ctx context.Context, b backend) error {
				err := b.Cancel(ctx, args[0])
				if errors.Is(err, errNotFound) {
					return exit(1, fmt.Errorf("no message with ID %q is parked or dead", args[0]))
				}
				if err != nil {
					return exit(1, err)
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
			return a.withBackend(cmd, func(ctx context.Context, b backend) error {
				v, err := b.Stats(ctx)
				if err != nil {
					return exit(1, err)
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
	)
	list := &cobra.Command{
		Use:     "list",
		Example: `  delaybridge dead list -c config.yaml --limit 20`,
		Short:   "List dead messages with their reasons, newest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withBackend(cmd, func(ctx context.Context, b backend) error {
				views, err := b.ListDead(ctx, limit)
				if err != nil {
					return exit(1, err)
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
	list.Flags().IntVar(&limit, "limit", 100, "at most this many")

	retry := &cobra.Command{
		Use:     "retry ID...",
		Example: `  delaybridge dead retry -c config.yaml order-42 order-43`,
		Short:   "Schedule dead messages again, due now; exit 1 if one is not dead",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkIDs(args...); err != nil {
				return err
			}
			return a.withBackend(cmd, func(ctx context.Context, b backend) error {
				var failed error
				for _, id := range args {
					err := b.RetryDead(ctx, id)
					switch {
					case errors.Is(err, errNotFound):
						failed = exit(1, fmt.Errorf("no dead message with ID %q", id))
						fmt.Fprintf(a.stderr, "not dead: %s\n", show(id))
					case err != nil:
						return exit(1, err)
					default:
						fmt.Fprintf(a.stdout, "scheduled again: %s\n", show(id))
					}
				}
				return failed
			})
		},
	}
	purge := &cobra.Command{
		Use:     "purge",
		Example: `  delaybridge dead purge -c config.yaml`,
		Short:   "Delete every dead message",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withBackend(cmd, func(ctx context.Context, b backend) error {
				n, err := b.PurgeDead(ctx)
				if err != nil {
					return exit(1, err)
				}
				fmt.Fprintf(a.stdout, "deleted %d dead messages\n", n)
				return nil
			})
		},
	}
	cmd.AddCommand(list, retry, purge)
	return cmd
}
