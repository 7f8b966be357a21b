package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// maxReportedLines bounds the bad lines import names one by one on stderr,
// and the unreadable messages export names; the summary counts them all.
const maxReportedLines = 1000

func (a *app) exportCmd() *cobra.Command {
	var (
		out  string
		dead bool
	)
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write every parked message as JSON Lines (for import into another layout)",
		Long: `Write every parked message of the Redis of --config as JSON Lines, one
message a line: ID, due time, route, headers, key, body (base64), attempts,
priority, recurrence, group (the format is documented in pkg/store/export.go
and docs/operations.md). In-flight and held messages are written as
scheduled. Dead messages are left out unless --dead.

It streams (memory stays bounded whatever the count) and reads each message
consistently, but it is not a snapshot of the whole Redis: stop the daemons
(or pause sinks and ingests) before an export meant for a migration.
Bodies are written in clear, also when Redis holds them encrypted: protect
the file. It works on Redis directly (--admin does not apply). A summary goes
to stderr; exit 1 when a message could not be read (each is named).`,
		Example: `  delaybridge export -c old.yaml --out parked.jsonl
  delaybridge export -c old.yaml --dead | gzip > parked.jsonl.gz`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, s *store.Store) error {
				if err := s.CheckShards(ctx); err != nil {
					return exit(1, err)
				}
				w, commit, abort, err := createOutput(out, a.stdout)
				if err != nil {
					return exit(1, err)
				}
				failed := 0
				st, err := s.Export(ctx, w, store.ExportOptions{Dead: dead, Failed: func(id string, err error) {
					if failed++; failed <= maxReportedLines {
						fmt.Fprintf(a.stderr, "cannot read %s: %v\n", show(id), err)
					}
				}})
				if err == nil && st.Failed == 0 {
					err = commit()
				} else {
					abort() // a file is whole or not there: one that lacks a message is not written
				}
				fmt.Fprintf(a.stderr, "exported %d (%d dead), dead left out %d, unreadable %d, removed while read %d\n",
					st.Exported, st.Dead, st.LeftOut, st.Failed, st.Vanished)
				if err != nil {
					return exit(1, fmt.Errorf("export incomplete: %w", err))
				}
				if st.Failed > 0 {
					if out != "" && out != "-" {
						return exit(1, fmt.Errorf("%d message(s) could not be read (each named above), so %s was not written", st.Failed, out))
					}
					return exit(1, fmt.Errorf("%d message(s) could not be read and are not in the export", st.Failed))
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "", "write to this file (created whole or not at all) instead of stdout")
	cmd.Flags().BoolVar(&dead, "dead", false, "include dead messages (state \"dead\", with their reason)")
	return cmd
}

// createOutput returns where export writes: stdout, or a temporary file
// beside path renamed to path by commit (removed by abort).
func createOutput(path string, stdout io.Writer) (w io.Writer, commit func() error, abort func(), err error) {
	if path == "" || path == "-" {
		return stdout, func() error { return nil }, func() {}, nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, nil, nil, err
	}
	abort = func() {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}
	commit = func() error {
		if err := f.Sync(); err != nil {
			abort()
			return err
		}
		if err := f.Close(); err != nil {
			_ = os.Remove(f.Name())
			return err
		}
		if err := os.Rename(f.Name(), path); err != nil {
			_ = os.Remove(f.Name())
			return err
		}
		return nil
	}
	return f, commit, abort, nil
}

func (a *app) importCmd() *cobra.Command {
	var (
		in      string
		replace bool
		onError string
	)
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Park the messages of an export (JSON Lines) in the Redis of --config",
		Long: `Read what delaybridge export wrote and park each message in the Redis of
--config, in its layout (redis.shards, redis.key_prefix, single Redis or
Cluster; sealed when encryption is configured), with its due time, attempts,
last error, priority, group and recurrence; dead ones stay dead.

Each message meets the rules of ingest under the configuration of --config,
as if its ingest had read it: limits, IDs and groups, schedules, control
headers, and its sink (configured) and destination (valid for the sink's
broker, outside the brokers' control planes unless the ingest's
allowed_destinations name them). A dead message is kept dead; a retry checks
its sink and destination again.

A message whose ID is already known (parked, in flight or dead) is skipped,
so importing a file twice imports it once; --replace overwrites it instead.
Every line is validated completely before anything of it is written, and each
message is written whole or not at all. A line that is not a valid record, or
whose message ingest would refuse, is reported with its line number and the
reason; --on-error=stop (the default) ends the import there (every line
before it is imported, none after: fix the line and import again, which
skips what is imported already), --on-error=skip goes on. It works on Redis
directly (--admin does not apply). A summary goes to stderr; exit 1 when a
line was bad.`,
		Example: `  delaybridge import -c new.yaml --in parked.jsonl
  gunzip -c parked.jsonl.gz | delaybridge import -c new.yaml --on-error=skip`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if onError != "stop" && onError != "skip" {
				return exit(2, fmt.Errorf("--on-error %q: give stop or skip", onError))
			}
			var r io.Reader = a.stdin
			if in != "" && in != "-" {
				f, err := os.Open(in)
				if err != nil {
					return exit(1, err)
				}
				defer f.Close()
				r = f
			}
			cfg, err := a.load()
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(ctx context.Context, s *store.Store) error {
				// An import may be the first writer of a store: it records
				// the layout it writes, as a daemon's start does.
				if _, err := s.CheckLayout(ctx, true); err != nil {
					return exit(1, err)
				}
				if err := s.CheckShards(ctx); err != nil {
					return exit(1, err)
				}
				var (
					bad  []int // the first shownLines bad lines
					nbad int
				)
				st, err := service(cfg, s).Import(ctx, r, store.ImportOptions{
					Replace: replace, Stop: onError == "stop",
					Bad: func(le *store.LineError) {
						if nbad++; nbad <= maxReportedLines {
							fmt.Fprintln(a.stderr, le)
						}
						if len(bad) < shownLines {
							bad = append(bad, le.Line)
						}
					},
				})
				fmt.Fprintf(a.stderr, "imported %d (%d dead), replaced %d, skipped %d known, %d bad line(s)%s\n",
					st.Imported, st.Dead, st.Replaced, st.Known, st.Bad, lineList(bad, st.Bad))
				var le *store.LineError
				switch {
				case errors.As(err, &le):
					return exit(1, fmt.Errorf("stopped at line %d (--on-error=stop): lines before it are imported, none after; "+
						"fix the line and import the file again (what is imported is skipped), or give --on-error=skip", le.Line))
				case err != nil:
					return exit(1, fmt.Errorf("import incomplete (importing again is safe): %w", err))
				case st.Bad > 0:
					return exit(1, fmt.Errorf("%d line(s) skipped", st.Bad))
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&in, "in", "i", "", "read this file instead of stdin")
	cmd.Flags().BoolVar(&replace, "replace", false, "overwrite a message already known under the same ID (whatever its state)")
	cmd.Flags().StringVar(&onError, "on-error", "stop", "a line that is not a valid record: stop (import nothing after it) or skip (go on)")
	return cmd
}

// shownLines is how many bad line numbers the summary names.
const shownLines = 20

// lineList is ": lines 3, 7, 9" for the first bad lines of total, "" for
// none.
func lineList(lines []int, total int) string {
	if len(lines) == 0 {
		return ""
	}
	lines = slices.Sorted(slices.Values(lines)) // a line refused when its batch is written is found after those read later
	var b strings.Builder
	b.WriteString(": line")
	if total > 1 {
		b.WriteString("s")
	}
	for i, n := range lines {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %d", n)
	}
	if total > len(lines) {
		fmt.Fprintf(&b, " and %d more", total-len(lines))
	}
	return b.String()
}
