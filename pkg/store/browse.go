package store

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Browsing lists messages in the order they fire, across every shard, a
// page at a time (GET /v1/messages, `delaybridge list`).
//
// The order is by the time a message's score stands for (its "position
// time"): the due time of a scheduled message, or the time of its next
// attempt after a failed one; the due time of a message held for its sink
// (store.Held: the score minus its hold band); the lease expiry of one in
// flight; and for dead messages (State dead) the time of death. Ties are
// broken by ID, byte-wise, so (time, ID) is a total order and a cursor is
// one position in it.
//
// Each shard runs one script that merges its own sorted streams (every due
// set of the shard, each hold band of each as a stream of its own, since a
// band is a range of scores above every due time) and returns the next
// entries after the cursor; the caller merges the shards and reads the
// messages of the chosen page only. Finding the cursor's place costs
// O(log^2 n) per stream (a binary search among equal scores); a page costs
// O(limit) per shard on top.
//
// Filters on the score alone (the position range, the state) and on the
// routing fields kept in clear in the stored message (sink, destination,
// ingest, group, recurring) are applied in the script. A filtered page
// examines at most BrowseScanFactor x limit entries over all shards; when
// it stops there, the page holds what was found (possibly fewer than limit,
// possibly none) and Next continues after what was examined. The group
// filter reads the group's index instead of scanning when a shard holds at
// most browseGroupIndexMax of the group's messages.
//
// Browsing is not a snapshot: a message that fires, moves (rescheduled,
// held, released) or is parked between two pages may be missed or listed
// twice, as with any cursor over live data.

// Browse bounds.
const (
	DefaultBrowseLimit = 100
	MaxBrowseLimit     = 1000
	// BrowseScanFactor x limit bounds the entries a filtered page examines.
	BrowseScanFactor = 10
)

// browseGroupIndexMax is the most messages of a group a shard lists
// through the group index; beyond it the shard scans with the filter.
var browseGroupIndexMax = 5000

// ErrBadCursor is returned by Browse for a cursor that is not one it made
// (altered, truncated, from another deployment) or that belongs to another
// kind of listing.
var ErrBadCursor = errors.New("store: invalid cursor")

// BrowseQuery selects messages to list.
type BrowseQuery struct {
	// State is "" for every parked message (scheduled, held and in
	// flight), StateScheduled, StateHeld, StateInflight, or StateDead (the
	// dead messages, by time of death).
	State string
	// DueAfter and DueBefore bound the position time: at or after
	// DueAfter, strictly before DueBefore; zero is unbounded. For dead
	// messages they bound the time of death.
	DueAfter, DueBefore time.Time
	// Sink, Destination, Ingest and Group, when not empty, must equal the
	// message's.
	Sink, Destination, Ingest, Group string
	// Recurring keeps the recurring messages only.
	Recurring bool
	// Limit is the page size, 1..MaxBrowseLimit; 0 is DefaultBrowseLimit.
	Limit int
	// Cursor is a Page's Next, "" for the first page.
	Cursor string
}

// filtered reports whether the query needs the entries examined one by one.
func (q *BrowseQuery) filtered() bool {
	return q.State == StateScheduled || q.State == StateHeld || q.State == StateInflight || q.Sink != "" || q.Destination != "" ||
		q.Ingest != "" || q.Group != "" || q.Recurring
}

// Page is one page of a listing.
type Page struct {
	// Messages in order, at most the query's limit. A message that went
	// away between finding it and reading it is left out.
	Messages []*Info
	// Next is the cursor of the next page, "" when the listing is done.
	Next string
	// Examined is how many entries the shards looked at.
	Examined int
}

// browseScript returns the next entries of one shard in browse order.
// (lua/browse.lua has its KEYS, ARGV and reply.)
var browseScript = loadScript("browse")

// browseEntry is one entry a shard's script returned.
type browseEntry struct {
	at    float64 // position time, ms
	id    string
	state byte // s, h, i, d
	shard int
}

func (e browseEntry) before(at float64, id string) bool {
	return e.at < at || (e.at == at && e.id < id)
}

// Browse returns one page of the messages the query selects, in position
// order across every shard (see the comment at the top of browse.go). It
// returns ErrBadCursor for a cursor it did not make or that belongs to
// another state's listing (dead or parked).
func (s *Store) Browse(ctx context.Context, q BrowseQuery) (*Page, error) {
	limit := q.Limit
	switch {
	case limit == 0:
		limit = DefaultBrowseLimit
	case limit < 0 || limit > MaxBrowseLimit:
		return nil, fmt.Errorf("store.browse: limit %d is not within 1..%d", limit, MaxBrowseLimit)
	}
	mode := byte('p')
	switch q.State {
	case "", StateScheduled, StateHeld, StateInflight:
	case StateDead:
		mode = 'd'
	default:
		return nil, fmt.Errorf("store.browse: unknown state %q", q.State)
	}
	key, err := s.cursorKey(ctx)
	if err != nil {
		return nil, err
	}
	var (
		hasCursor bool
		curAt     float64
		curID     string
	)
	if q.Cursor != "" {
		c, err := openCursor(key, s.keys.prefix, q.Cursor)
		if err != nil {
			return nil, err
		}
		if c.mode != mode {
			return nil, fmt.Errorf("%w: it continues a listing of %s messages, not of %s ones", ErrBadCursor, modeName(c.mode), modeName(mode))
		}
		hasCursor, curAt, curID = true, c.at, c.id
	}
	bands, err := s.bandsInUse(ctx)
	if err != nil {
		return nil, fmt.Errorf("store.browse: %w", err)
	}
	scan := 0
	if q.filtered() {
		scan = max(1, (BrowseScanFactor*limit+s.shards-1)/s.shards)
	}
	args := []any{map[byte]string{'p': "parked", 'd': "dead"}[mode], boolArg(hasCursor), formatAt(curAt), curID,
		timeArg(q.DueAfter), timeArg(q.DueBefore), bands, 0, scan,
		map[string]string{StateScheduled: "scheduled", StateHeld: "held", StateInflight: "inflight"}[q.State],
		q.Sink, q.Destination, q.Ingest, q.Group, boolArg(q.Recurring), browseGroupIndexMax}
	if q.Group != "" {
		// Every form the group is indexed under (encrypted: its token).
		forms := s.codec.GroupIndexes(q.Group)
		args[13] = forms[0]
		for _, f := range forms[1:] {
			args = append(args, f)
		}
	}
	// A first round asks each shard for a share of the page, which fills it
	// when the messages are spread over the shards as their IDs spread
	// them. When it does not, and a shard stopped at its share, a second
	// round asks each for the whole page; a filtered page instead ends
	// there (it may be short), which keeps it within its scan bound.
	share := min(limit, 2*((limit+s.shards-1)/s.shards)+4)
	r, err := s.browseRound(ctx, args, share)
	if err != nil {
		return nil, err
	}
	examined := r.examined
	if len(r.entries) < limit && r.cut && share < limit && !q.filtered() {
		if r, err = s.browseRound(ctx, args, limit); err != nil {
			return nil, err
		}
		examined += r.examined
	}
	entries := r.entries
	page := &Page{Examined: examined}
	switch {
	case len(entries) >= limit:
		entries = entries[:limit]
		last := entries[limit-1]
		page.Next = sealCursor(key, s.keys.prefix, cursor{mode: mode, at: last.at, id: last.id})
	case r.frontier.set:
		page.Next = sealCursor(key, s.keys.prefix, cursor{mode: mode, at: r.frontier.at, id: r.frontier.id})
	}
	page.Messages, err = s.readEntries(ctx, entries)
	if err != nil {
		return nil, err
	}
	return page, nil
}

// browseRound is one call of the browse script per shard, each for at most
// perShard entries: the entries up to the lowest frontier, in order; that
// frontier (unset when every shard was done); and whether a shard stopped
// at perShard.
type browseRound struct {
	entries  []browseEntry
	frontier struct {
		set bool
		at  float64
		id  string
	}
	cut      bool
	examined int
}

func (s *Store) browseRound(ctx context.Context, args []any, perShard int) (*browseRound, error) {
	args = slices.Clone(args)
	args[7] = perShard
	calls := make([]shardCall, s.shards)
	for i := range calls {
		calls[i] = shardCall{shard: i, args: args}
	}
	r := &browseRound{}
	for i, cmd := range s.runEach(ctx, "browse", browseScript, calls) {
		res, err := cmd.Slice()
		if err != nil {
			return nil, fmt.Errorf("store.browse shard %d: %w", i, err)
		}
		if len(res) < 4 || (len(res)-4)%3 != 0 {
			return nil, fmt.Errorf("store.browse shard %d: unexpected reply of %d items", i, len(res))
		}
		r.examined += int(toInt64(res[3]))
		why, _ := toString(res[0])
		if why != "done" {
			r.cut = r.cut || why == "limit"
			fs, _ := toString(res[1])
			fid, _ := toString(res[2])
			at, err := strconv.ParseFloat(fs, 64)
			if err != nil {
				return nil, fmt.Errorf("store.browse shard %d: frontier %q: %w", i, fs, err)
			}
			if !r.frontier.set || (browseEntry{at: at, id: fid}).before(r.frontier.at, r.frontier.id) {
				r.frontier.set, r.frontier.at, r.frontier.id = true, at, fid
			}
		}
		for j := 4; j < len(res); j += 3 {
			as, _ := toString(res[j])
			id, _ := toString(res[j+1])
			st, _ := toString(res[j+2])
			at, err := strconv.ParseFloat(as, 64)
			if err != nil || len(st) != 1 {
				return nil, fmt.Errorf("store.browse shard %d: unexpected entry %q %q", i, as, st)
			}
			r.entries = append(r.entries, browseEntry{at: at, id: id, state: st[0], shard: i})
		}
	}
	slices.SortFunc(r.entries, func(a, b browseEntry) int {
		switch {
		case a.before(b.at, b.id):
			return -1
		case b.before(a.at, a.id):
			return 1
		}
		return 0
	})
	// Only the entries up to the lowest frontier are known to be all there
	// is: a shard that stopped early may hold more before the others' next.
	if r.frontier.set {
		n := 0
		for n < len(r.entries) && !(browseEntry{at: r.frontier.at, id: r.frontier.id}).before(r.entries[n].at, r.entries[n].id) {
			n++
		}
		r.entries = r.entries[:n]
	}
	return r, nil
}

// readEntries reads the messages and meta values of a page's entries in
// one pipeline, leaving out those that went away meanwhile.
func (s *Store) readEntries(ctx context.Context, entries []browseEntry) ([]*Info, error) {
	out := make([]*Info, 0, len(entries))
	if len(entries) == 0 {
		return out, nil
	}
	pipe := s.rdb.Pipeline()
	blobs := make([]*redis.StringCmd, len(entries))
	metas := make([]*redis.StringCmd, len(entries))
	nexts := make([]*redis.StringCmd, len(entries)) // of those in flight: a cancel's mark (Info.SeriesEnds)
	for i, e := range entries {
		blobs[i] = pipe.HGet(ctx, s.keys.Pool(e.shard), e.id)
		metas[i] = pipe.HGet(ctx, s.keys.Meta(e.shard), e.id)
		if e.state == 'i' {
			nexts[i] = pipe.HGet(ctx, s.keys.Next(e.shard), e.id)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store.browse: read messages: %w", err)
	}
	for i, e := range entries {
		blob, err := blobs[i].Result()
		if err != nil {
			continue // delivered or cancelled since the script saw it
		}
		info := &Info{ID: e.id, Shard: e.shard, EncodedSize: len(blob)}
		s.decodeInto(info, blob)
		var deadAt int64
		if m, err := metas[i].Result(); err == nil {
			info.Attempts, deadAt, info.Reason = s.meta(e.id, m)
		}
		at := time.UnixMilli(int64(math.Floor(e.at)))
		switch e.state {
		case 'd':
			info.State, info.DeadAt = StateDead, time.UnixMilli(deadAt)
			if deadAt == 0 {
				info.DeadAt = at
			}
		case 'i':
			info.State, info.NextAt = StateInflight, at
			info.Attempts++ // the one under way, as Inspect counts it
			if waiting, err := nexts[i].Result(); err == nil {
				info.SeriesEnds = strings.HasPrefix(waiting, endsMark)
			}
		case 'h':
			info.State, info.NextAt, info.Held = StateHeld, at, true
		default:
			info.State, info.NextAt = StateScheduled, at
			if claimedAhead(e.at) && info.Message != nil {
				// claimed ahead by an instance: at its due time, as Inspect
				// says (the score is the claim's lease expiry)
				info.NextAt = info.Message.DueAt
			}
		}
		out = append(out, info)
	}
	return out, nil
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func timeArg(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(ms(t), 10)
}

func formatAt(at float64) string { return strconv.FormatFloat(at, 'f', -1, 64) }

func modeName(m byte) string {
	if m == 'd' {
		return "dead"
	}
	return "parked"
}

// A cursor is a position in a listing, sealed with an HMAC under a key
// every instance shares (kept in the config hash), so that a client cannot
// forge one that makes a script search from a position it chose, and an
// altered cursor is told apart from a valid one:
//
//	byte    version (1)
//	byte    mode ('p' parked, 'd' dead)
//	8 bytes position time, float64 bits, big endian
//	...     ID
//	16 bytes HMAC-SHA256 of the key prefix and the above, truncated
//
// in unpadded URL-safe base64.
type cursor struct {
	mode byte
	at   float64
	id   string
}

const (
	cursorVersion = 1
	cursorMACSize = 16
	cursorField   = "cursor_key" // of the config hash
)

func cursorMAC(key []byte, prefix string, payload []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("delaybridge cursor\x00" + prefix + "\x00"))
	h.Write(payload)
	return h.Sum(nil)[:cursorMACSize]
}

func sealCursor(key []byte, prefix string, c cursor) string {
	b := make([]byte, 0, 10+len(c.id)+cursorMACSize)
	b = append(b, cursorVersion, c.mode)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(c.at))
	b = append(b, c.id...)
	b = append(b, cursorMAC(key, prefix, b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func openCursor(key []byte, prefix, s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 10+cursorMACSize {
		return cursor{}, fmt.Errorf("%w: it is not a cursor this listing returned (use next_cursor as given)", ErrBadCursor)
	}
	payload, mac := b[:len(b)-cursorMACSize], b[len(b)-cursorMACSize:]
	if !hmac.Equal(mac, cursorMAC(key, prefix, payload)) {
		return cursor{}, fmt.Errorf("%w: it was altered, or made by another deployment (use next_cursor as given)", ErrBadCursor)
	}
	if payload[0] != cursorVersion {
		return cursor{}, fmt.Errorf("%w: version %d is not known to this delaybridge", ErrBadCursor, payload[0])
	}
	c := cursor{mode: payload[1], at: math.Float64frombits(binary.BigEndian.Uint64(payload[2:10])), id: string(payload[10:])}
	if math.IsNaN(c.at) || math.IsInf(c.at, 0) || (c.mode != 'p' && c.mode != 'd') {
		return cursor{}, fmt.Errorf("%w: it does not hold a position", ErrBadCursor)
	}
	return c, nil
}

// cursorCache holds a Store's cursor key once read.
type cursorCache struct {
	mu  sync.Mutex
	key []byte
}

// cursorKey returns the deployment's cursor key: 32 random bytes that the
// first instance to need one stores in the config hash, and every instance
// (and the command line) then reads.
func (s *Store) cursorKey(ctx context.Context) ([]byte, error) {
	s.cursor.mu.Lock()
	defer s.cursor.mu.Unlock()
	if s.cursor.key != nil {
		return s.cursor.key, nil
	}
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, fmt.Errorf("store.cursor_key: %w", err)
	}
	cfg := s.keys.Config()
	if err := s.rdb.HSetNX(ctx, cfg, cursorField, hex.EncodeToString(fresh)).Err(); err != nil {
		return nil, fmt.Errorf("store.cursor_key: record in %s: %w", cfg, err)
	}
	v, err := s.rdb.HGet(ctx, cfg, cursorField).Result()
	if err != nil {
		return nil, fmt.Errorf("store.cursor_key: read from %s: %w", cfg, err)
	}
	k, err := hex.DecodeString(strings.TrimSpace(v))
	if err != nil || len(k) < 16 {
		return nil, fmt.Errorf("store.cursor_key: %s field %s is not a hex key of at least 16 bytes; delete the field to make a new one", cfg, cursorField)
	}
	s.cursor.key = k
	return k, nil
}
