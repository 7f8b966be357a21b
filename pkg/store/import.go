package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/strictjson"
)

// importScript writes imported messages, each whole or not at all: its
// stored bytes, due or dead entry, meta, group entry and replacement.
// (lua/import.lua has its KEYS, ARGV and reply.)
var importScript = loadScript("import")

// ImportOptions configure Import.
type ImportOptions struct {
	// Replace overwrites a message already known under a record's ID,
	// whatever its state (a message in flight may still be published by
	// its claimer). Without it such records are skipped (ImportStats.Known),
	// which makes importing the same file twice harmless. A known message
	// of another source (another ingest, or the admin API) is neither:
	// the record is refused (id_taken), as ingest refuses it.
	Replace bool
	// Stop ends the import at the first line that is not a valid record:
	// every record before it is imported, none after. A line refused only
	// as it is written (a series past its bound, an ID another source
	// holds) ends it after its batch (Batch): the lines of that batch are
	// written. Without it such lines are skipped and counted.
	Stop bool
	// MaxIDBytes is limits.max_id_bytes: IDs and groups follow the rule of
	// every other path (envelope.CheckID); 0 means no length limit.
	MaxIDBytes int
	// MaxLineBytes bounds a line; a longer one is a bad line. 0 means
	// 64 MiB.
	MaxLineBytes int
	// Batch is how many messages are written per round (one script call
	// per shard, in one pipeline); 0 means 1000.
	Batch int
	// Admit applies the rules of ingest to the message of a valid record
	// (and to the replacement waiting behind it, with a meta of its own:
	// scheduled at its due time) and returns what to write, or an error
	// wrapping ErrRefused that names the rule. It is required: the rules
	// are not the store's (ops.Service.Import is the one that applies
	// them).
	Admit func(m *envelope.Message, meta *RecordMeta) (*envelope.Message, error)
	// Bad, when set, is called for each line that is not a valid record or
	// that Admit refuses.
	Bad func(*LineError)
}

// ImportStats counts what Import did.
type ImportStats struct {
	Lines    int // lines read, empty ones aside
	Imported int // new messages, Dead of them dead
	Dead     int
	Replaced int // ImportOptions.Replace: overwrote a known message
	Known    int // skipped: the ID is already parked, in flight or dead
	Bad      int // not valid records, or refused (ErrRefused): nothing of them written
}

// LineError is a line of an import that is not a valid record.
type LineError struct {
	Line int // from 1
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

func (e *LineError) Unwrap() error { return e.Err }

// ErrBadRecord is wrapped by the LineError of a line that is not a valid
// record of the export format.
var ErrBadRecord = errors.New("not a valid export record")

// ErrRefused is wrapped by the LineError of a valid record whose message
// ingest would have refused (ImportOptions.Admit).
var ErrRefused = errors.New("refused by the rules of ingest")

const (
	importBatchBytes   = 8 << 20
	defaultMaxLineSize = 64 << 20
)

// importItem is a validated record, ready for importScript.
type importItem struct {
	shard int
	args  []any // the script's values of a message but the last (importBatch adds its source's series quota)
	size  int
	dead  bool
	line  int               // its line, from 1
	recur *envelope.Message // of a recurring message, its ID, ingest and schedule: for the series bounds (seriesQuotasFor)
}

// Import reads the export format from r and writes each record as a
// message, streaming: a line is parsed, validated and admitted by
// ImportOptions.Admit completely before anything of it is written (a line
// that is not a valid record, or that Admit refuses, writes nothing; see
// ImportOptions.Stop for the lines after it), and each message is written by one script
// call, whole or not at all. Records are written in rounds of
// ImportOptions.Batch; on a Redis error the messages of the round in
// flight may or may not be written (importing again is safe). Messages are
// written into this Store's layout (its prefix and shard count, sealed with
// its Sealer); held and in-flight messages of the export are scheduled
// (see Record).
func (s *Store) Import(ctx context.Context, r io.Reader, o ImportOptions) (ImportStats, error) {
	batch := o.Batch
	if batch <= 0 {
		batch = 1000
	}
	maxLine := o.MaxLineBytes
	if maxLine <= 0 {
		maxLine = defaultMaxLineSize
	}
	if o.Admit == nil {
		return ImportStats{}, errors.New("store.import: ImportOptions.Admit is required (the rules of ingest: ops.Service.Import)")
	}
	var st ImportStats            // lines read, bad ones
	if bad := o.Bad; bad != nil { // the writer tells of lines too (a series past its bound)
		var mu sync.Mutex
		o.Bad = func(le *LineError) {
			mu.Lock()
			defer mu.Unlock()
			bad(le)
		}
	}
	w := s.startImportWriter(ctx, o)
	err := s.importLines(ctx, r, o, batch, maxLine, w, &st)
	ws, werr := w.close()
	st.Imported, st.Dead, st.Replaced, st.Known = ws.Imported, ws.Dead, ws.Replaced, ws.Known
	st.Bad += ws.Bad
	if werr != nil {
		return st, werr
	}
	return st, err
}

// importLines parses r line by line and hands batches of valid records to
// w. It returns a *LineError when o.Stop and a line is bad, after handing
// over every record before it.
func (s *Store) importLines(ctx context.Context, r io.Reader, o ImportOptions, batch, maxLine int, w *importWriter, st *ImportStats) error {
	br := bufio.NewReaderSize(r, 1<<20)
	var (
		items []importItem
		size  int
		line  []byte
	)
	flush := func() error {
		if len(items) == 0 {
			return nil
		}
		err := w.send(items)
		items, size = make([]importItem, 0, batch), 0
		return err
	}
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		var tooLong bool
		var err error
		line, tooLong, err = readLine(br, line[:0], maxLine)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("store.import: read line %d: %w", n, err)
		}
		if n == 1 {
			line = bytes.TrimPrefix(line, utf8BOM) // a file saved by an editor that marks UTF-8
		}
		if len(bytes.TrimSpace(line)) == 0 && !tooLong {
			continue
		}
		st.Lines++
		var it importItem
		if tooLong {
			err = fmt.Errorf("longer than %d bytes", maxLine)
		} else {
			it, err = s.importItem(line, o)
			it.line = n
		}
		if err != nil {
			if !errors.Is(err, ErrRefused) {
				err = fmt.Errorf("%w: %v", ErrBadRecord, err)
			}
			le := &LineError{Line: n, Err: err}
			st.Bad++
			if o.Bad != nil {
				o.Bad(le)
			}
			if o.Stop {
				if err := flush(); err != nil {
					return err
				}
				return le
			}
			continue
		}
		items = append(items, it)
		if size += it.size; len(items) >= batch || size >= importBatchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// importWriter writes batches of an import in a goroutine of its own, so
// that parsing the next batch overlaps writing this one; at most one batch
// waits.
type importWriter struct {
	batches chan []importItem
	done    chan struct{} // closed when the goroutine ends
	st      ImportStats   // written by the goroutine, read after done
	err     error
}

func (s *Store) startImportWriter(ctx context.Context, o ImportOptions) *importWriter {
	w := &importWriter{batches: make(chan []importItem, 1), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for items := range w.batches {
			if err := s.importBatch(ctx, o, items, &w.st); err != nil {
				w.err = err
				return
			}
		}
	}()
	return w
}

// send hands a batch to the writer; it fails when the writer stopped on an
// error.
func (w *importWriter) send(items []importItem) error {
	select {
	case w.batches <- items:
		return nil
	case <-w.done:
		return w.err
	}
}

// close waits for the batches handed over to be written.
func (w *importWriter) close() (ImportStats, error) {
	close(w.batches)
	<-w.done
	return w.st, w.err
}

// utf8BOM is the byte order mark some editors start a UTF-8 file with.
var utf8BOM = []byte("\xef\xbb\xbf")

// readLine reads a line into buf without its line end. A line over max
// bytes is read to its end and reported as tooLong, its bytes dropped. It
// returns io.EOF only when nothing is left.
func readLine(br *bufio.Reader, buf []byte, max int) (line []byte, tooLong bool, err error) {
	read := false
	for {
		frag, err := br.ReadSlice('\n')
		read = read || len(frag) > 0
		if !tooLong {
			if len(buf)+len(frag) > max+2 { // room for "\r\n"
				tooLong, buf = true, buf[:0]
			} else {
				buf = append(buf, frag...)
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && read:
		case err != nil:
			return buf, tooLong, err
		}
		buf = bytes.TrimSuffix(bytes.TrimSuffix(buf, []byte("\n")), []byte("\r"))
		if len(buf) > max {
			tooLong, buf = true, buf[:0]
		}
		return buf, tooLong, nil
	}
}

// importItem parses and validates one line, and has o.Admit apply the
// rules of ingest to its messages.
func (s *Store) importItem(line []byte, o ImportOptions) (importItem, error) {
	// Read as strictly as the admin API reads a request (strictjson: its
	// depth bound, no key twice or in another case, no invalid UTF-8), so
	// that a line is what every reader of it takes it for.
	var rec Record
	if status, reason := strictjson.Decode(line, &rec); status != 0 {
		return importItem{}, fmt.Errorf("not a JSON record: %s", strings.ReplaceAll(reason, "request body", "line"))
	}
	m, meta, err := rec.Parse(o.MaxIDBytes)
	if err != nil {
		return importItem{}, err
	}
	if m, err = o.Admit(m, meta); err != nil {
		return importItem{}, err
	}
	if r := meta.Replacement; r != nil {
		if meta.Replacement, err = o.Admit(r, &RecordMeta{State: StateScheduled, NextAt: r.DueAt}); err != nil {
			return importItem{}, fmt.Errorf("replacement: %w", err)
		}
	}
	prio := min(int(m.Priority), MaxPriority)
	it := importItem{shard: s.ShardOf(m.ID), dead: meta.State == StateDead}
	if m.Recur != nil {
		it.recur = &envelope.Message{ID: m.ID, Ingest: m.Ingest, Recur: m.Recur}
	}
	blob := s.encode(m)
	score, state := meta.NextAt.UnixMilli(), "s"
	metaV := ""
	if it.dead {
		score, state = meta.DeadAt.UnixMilli(), "d"
		metaV = fmt.Sprintf("%d|%d|%d|%s", meta.Attempts, score, prio, s.codec.SealReason(m.ID, meta.Reason))
	} else if meta.Attempts > 0 || meta.Reason != "" {
		metaV = fmt.Sprintf("%d|0|%d|%s", meta.Attempts, prio, s.codec.SealReason(m.ID, meta.Reason))
	}
	var next []byte
	if meta.Replacement != nil {
		if meta.Follows {
			next = []byte(followsMark)
		}
		next = append(next, s.encode(meta.Replacement)...)
	}
	it.args = []any{m.ID, state, score, prio, blob, metaV, next, s.codec.GroupIndex(m.Group)}
	it.size = len(blob) + len(next) + len(m.ID) + len(metaV)
	return it, nil
}

// importBatch writes items, one script call per shard in one pipeline. A
// scheduled record that would be a new recurring series past
// limits.max_series or its ingest's max_series, or whose ID the store knows
// as another source's message, is refused as ingest refuses it: a bad line
// (o.Bad), nothing of it written. With o.Stop the first such line is
// returned, which stops the import after this batch.
func (s *Store) importBatch(ctx context.Context, o ImportOptions, items []importItem, st *ImportStats) error {
	if len(items) == 0 {
		return nil
	}
	flag := 0
	if o.Replace {
		flag = 1
	}
	var live []*envelope.Message
	for _, it := range items {
		if !it.dead && it.recur != nil {
			live = append(live, it.recur)
		}
	}
	quotas, err := s.seriesQuotasFor(ctx, live)
	if err != nil {
		return fmt.Errorf("store.import: %w", err)
	}
	pos := map[int]int{}
	var calls []shardCall
	var index [][]int
	for i, it := range items {
		c, ok := pos[it.shard]
		if !ok {
			c = len(calls)
			pos[it.shard] = c
			calls = append(calls, shardCall{shard: it.shard, args: []any{flag, quotas.storeQuota(it.shard)}})
			index = append(index, nil)
		}
		srcQuota := int64(noBound)
		if !it.dead && it.recur != nil {
			srcQuota = quotas.sourceQuota(it.shard, it.recur.Ingest)
		}
		calls[c].args = append(append(calls[c].args, it.args...), srcQuota)
		index[c] = append(index[c], i)
	}
	inflight := false
	var stopped *LineError // ImportOptions.Stop: the first line refused as it was written
	for c, cmd := range s.runEach(ctx, "import", importScript, calls) {
		res, err := cmd.Int64Slice()
		if err != nil {
			return fmt.Errorf("store.import shard %d: %w", calls[c].shard, err)
		}
		if len(res) != len(index[c]) {
			return fmt.Errorf("store.import shard %d: %d results for %d messages", calls[c].shard, len(res), len(index[c]))
		}
		for j, v := range res {
			switch v {
			case 0:
				st.Known++
				continue
			case 4, 5, 6:
				st.Bad++
				it := items[index[c][j]]
				why := "the store holds as many live recurring series as limits.max_series allows"
				switch v {
				case 5:
					why = fmt.Sprintf("ingest %q holds as many live recurring series as its max_series allows", it.recur.Ingest)
				case 6:
					why = envelope.ReasonIDTaken
				}
				le := &LineError{Line: it.line, Err: fmt.Errorf("%w: %s", ErrRefused, why)}
				if o.Bad != nil {
					o.Bad(le)
				}
				if o.Stop && (stopped == nil || le.Line < stopped.Line) {
					stopped = le
				}
				continue
			case 2, 3:
				st.Replaced++
				inflight = inflight || v == 3
			default:
				st.Imported++
			}
			if items[index[c][j]].dead {
				st.Dead++
			}
		}
	}
	if inflight {
		if err := s.afterCommitLead(ctx); err != nil {
			return err
		}
	}
	if stopped != nil {
		return stopped // the lines of this batch after it are written; none of the next
	}
	return nil
}

// RecordMeta is what a Record says of a message beyond the message itself.
type RecordMeta struct {
	State    string    // StateScheduled or StateDead
	NextAt   time.Time // scheduled: when it is due (next_at, else due_at)
	DeadAt   time.Time // dead: when it died
	Attempts int
	Reason   string // last_error (scheduled) or reason (dead)
	// Replacement is the message waiting for the version in flight, and
	// Follows whether it is a follower rather than a replacement.
	Replacement *envelope.Message
	Follows     bool
}

// Parse validates the shape of a record completely (every field there, of
// its type, in the ranges the store keeps) and returns its message and the
// rest; what a message may be beyond that is the rules of ingest, which
// ImportOptions.Admit applies. IDs and groups follow envelope.CheckID with
// maxID bytes (0: no limit). The error names the field.
func (r *Record) Parse(maxID int) (*envelope.Message, *RecordMeta, error) {
	if r.V != ExportVersion {
		if r.V == 0 {
			return nil, nil, errors.New(`"v" is missing`)
		}
		return nil, nil, fmt.Errorf(`"v" is %d; this delaybridge reads version %d (written by a newer delaybridge?)`, r.V, ExportVersion)
	}
	if r.ID == "" {
		return nil, nil, errors.New(`"id" is missing`)
	}
	if reason := envelope.CheckID(`"id"`, string(r.ID), maxID); reason != "" {
		return nil, nil, errors.New(reason)
	}
	m, err := r.message(maxID)
	if err != nil {
		return nil, nil, err
	}
	m.ID = string(r.ID)
	meta := &RecordMeta{State: r.State, Attempts: r.Attempts}
	if r.Attempts < 0 {
		return nil, nil, errors.New(`"attempts" is negative`)
	}
	switch r.State {
	case StateScheduled:
		switch {
		case r.Follows:
			return nil, nil, errors.New(`"follows" belongs on a "replacement"`)
		case r.DeadAt != "" || r.Reason != "":
			return nil, nil, errors.New(`a scheduled message has no "dead_at" or "reason" (its last error is "last_error")`)
		}
		meta.NextAt, meta.Reason = m.DueAt, string(r.LastError)
		if r.NextAt != "" {
			if meta.NextAt, err = parseRecordTime("next_at", r.NextAt); err != nil {
				return nil, nil, err
			}
		}
		if r.Replacement != nil {
			rr := r.Replacement
			switch {
			case rr.V != 0 || (rr.ID != "" && rr.ID != r.ID) || (rr.State != "" && rr.State != StateScheduled):
				return nil, nil, errors.New(`"replacement" has no "v", "state" or "id" of its own`)
			case rr.NextAt != "" || rr.Attempts != 0 || rr.LastError != "" || rr.DeadAt != "" || rr.Reason != "" || rr.Replacement != nil:
				return nil, nil, errors.New(`"replacement" has no "next_at", "attempts", "last_error", "dead_at", "reason" or "replacement"`)
			}
			if meta.Replacement, err = rr.message(maxID); err != nil {
				return nil, nil, fmt.Errorf("replacement: %w", err)
			}
			if meta.Replacement.Ingest != m.Ingest {
				// A later version of a message, or a message of its ID
				// that came while it was in flight, came through the
				// same source: one of another is refused (id_taken).
				return nil, nil, fmt.Errorf(`"replacement" has the "ingest" %q, its message %q: a version of a message comes from the message's own source`, meta.Replacement.Ingest, m.Ingest)
			}
			meta.Follows = rr.Follows
			meta.Replacement.ID = m.ID
		}
	case StateDead:
		switch {
		case r.DeadAt == "":
			return nil, nil, errors.New(`a dead message needs "dead_at"`)
		case r.NextAt != "" || r.LastError != "" || r.Replacement != nil || r.Follows:
			return nil, nil, errors.New(`a dead message has no "next_at", "last_error", "replacement" or "follows" (its error is "reason")`)
		}
		if meta.DeadAt, err = parseRecordTime("dead_at", r.DeadAt); err != nil {
			return nil, nil, err
		}
		meta.Reason = string(r.Reason)
	case "":
		return nil, nil, errors.New(`"state" is missing`)
	default:
		return nil, nil, fmt.Errorf(`"state" %q is not scheduled or dead`, r.State)
	}
	return m, meta, nil
}

// message validates the fields of the envelope.Message (all but the ID).
func (r *Record) message(maxID int) (*envelope.Message, error) {
	var err error
	m := &envelope.Message{Sink: string(r.Sink), Destination: string(r.Destination), Ingest: string(r.Ingest), Group: string(r.Group)}
	if r.DueAt == "" {
		return nil, errors.New(`"due_at" is missing`)
	}
	if m.DueAt, err = parseRecordTime("due_at", r.DueAt); err != nil {
		return nil, err
	}
	if m.Sink == "" {
		return nil, errors.New(`"sink" is missing`)
	}
	if r.Priority < 0 || r.Priority > MaxPriority {
		return nil, fmt.Errorf(`"priority" %d is not from 0 to %d`, r.Priority, MaxPriority)
	}
	m.Priority = uint8(r.Priority)
	if m.Group != "" {
		if reason := envelope.CheckID(`"group"`, m.Group, maxID); reason != "" {
			return nil, errors.New(reason)
		}
	}
	if r.IngestedAt != "" {
		if m.IngestedAt, err = parseRecordTime("ingested_at", r.IngestedAt); err != nil {
			return nil, err
		}
	}
	if r.PublishedAt != "" {
		// To the nanosecond: it orders versions (envelope.Origin).
		if m.PublishedAt, err = time.Parse(time.RFC3339Nano, r.PublishedAt); err != nil {
			return nil, fmt.Errorf(`"published_at" %s is not an RFC 3339 time (2026-05-01T10:00:00.000123456Z)`, strconv.Quote(r.PublishedAt))
		}
	}
	if o := r.Origin; o != nil {
		m.Origin = envelope.Origin{Log: string(o.Log), Pos: o.Pos}
		if o.Print != "" {
			if m.Origin.Print, err = strconv.ParseUint(o.Print, 16, 64); err != nil || m.Origin.Log != "" {
				return nil, fmt.Errorf(`"origin.print" %s is not a hexadecimal print of a message without a log`, strconv.Quote(o.Print))
			}
		}
	}
	m.NullBody = r.BodyNull
	m.Source = string(r.Source)
	if m.NullBody && r.BodyBase64 != "" {
		return nil, errors.New(`"body_null" with a "body_base64": a null body has no bytes`)
	}
	if r.KeyBase64 != nil {
		if m.Key, err = base64.StdEncoding.DecodeString(*r.KeyBase64); err != nil {
			return nil, fmt.Errorf(`"key_base64": %v`, err)
		}
		if m.Key == nil {
			m.Key = []byte{}
		}
	}
	if m.Headers, err = parseRecordHeaders("headers", r.Headers); err != nil {
		return nil, err
	}
	if m.Properties, err = parseRecordHeaders("properties", r.Properties); err != nil {
		return nil, err
	}
	if m.Body, err = base64.StdEncoding.DecodeString(r.BodyBase64); err != nil {
		return nil, fmt.Errorf(`"body_base64": %v`, err)
	}
	if r.Recurrence != nil {
		if m.Recur, err = r.Recurrence.parse(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (rr *RecordRecurrence) parse() (*envelope.Recurrence, error) {
	c := &envelope.Recurrence{Cron: string(rr.Cron), TimeZone: string(rr.TimeZone), Count: rr.Count, N: rr.N}
	var err error
	switch {
	case (rr.Every == "") == (rr.Cron == ""):
		return nil, errors.New(`"recurrence" has one of "every" and "cron"`)
	case rr.Every != "":
		// How long it may be is a rule of ingest (ImportOptions.Admit).
		if c.Every, err = time.ParseDuration(rr.Every); err != nil {
			return nil, fmt.Errorf(`"recurrence.every" %q is not a Go duration (1m30s)`, rr.Every)
		}
	}
	if rr.Anchor == "" {
		return nil, errors.New(`"recurrence.anchor" is missing`)
	}
	if c.Anchor, err = parseRecordTime("recurrence.anchor", rr.Anchor); err != nil {
		return nil, err
	}
	if rr.Until != "" {
		if c.Until, err = parseRecordTime("recurrence.until", rr.Until); err != nil {
			return nil, err
		}
	}
	switch {
	case rr.Count < 0:
		return nil, fmt.Errorf(`"recurrence.count" %d is negative (0: no limit)`, rr.Count)
	case rr.N < 1:
		return nil, fmt.Errorf(`"recurrence.n" %d is not at least 1`, rr.N)
	case rr.Count > 0 && rr.N > rr.Count:
		return nil, fmt.Errorf(`"recurrence.n" %d is past "recurrence.count" %d: the series has no such occurrence`, rr.N, rr.Count)
	case rr.MissedMax < 0:
		return nil, fmt.Errorf(`"recurrence.missed_max" %d is negative (absent: the route's)`, rr.MissedMax)
	}
	c.MissedMax = rr.MissedMax
	if rr.Missed == "" {
		return nil, errors.New(`"recurrence.missed" is missing`)
	}
	if c.Missed, err = envelope.ParseMissed(rr.Missed); err != nil {
		return nil, fmt.Errorf(`"recurrence.missed": %v`, err)
	}
	return c, nil
}

func parseRecordHeaders(field string, rhs []RecordHeader) (envelope.Headers, error) {
	if len(rhs) == 0 {
		return nil, nil
	}
	hs := make(envelope.Headers, len(rhs))
	for i, rh := range rhs {
		hs[i] = envelope.Header{Key: string(rh.Key), Value: string(rh.Value), Null: rh.Null}
		if rh.Null && rh.Value != "" {
			return nil, fmt.Errorf(`"%s"[%d]: "null" with a value`, field, i)
		}
		if rh.NativeBase64 != "" {
			v, err := base64.StdEncoding.DecodeString(rh.NativeBase64)
			if err != nil {
				return nil, fmt.Errorf(`"%s"[%d].native_base64: %v`, field, i, err)
			}
			hs[i].Native = string(v)
		}
	}
	return hs, nil
}

// parseRecordTime reads an RFC 3339 time of a record; digits below the
// millisecond round it up (never early), and it must lie within what the
// store keeps (1970 to 2109).
func parseRecordTime(field, v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf(`"%s" %s is not an RFC 3339 time (2026-05-01T10:00:00.000Z)`, field, strconv.Quote(v))
	}
	t = envelope.CeilMillis(t)
	if ms := t.UnixMilli(); ms < 0 || ms >= HoldBand {
		return time.Time{}, fmt.Errorf(`"%s" %s is not between 1970 and 2109`, field, v)
	}
	return time.UnixMilli(t.UnixMilli()), nil
}
