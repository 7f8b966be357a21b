package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/lifecycle"
)

// ErrNotFound is returned for an ID that is neither parked nor dead.
var ErrNotFound = errors.New("store: message not found")

// ErrShardMismatch is returned by CheckShards when Redis holds messages
// parked under another shard count.
var ErrShardMismatch = errors.New("store: shard count differs from the one recorded in Redis")

// Store is the Redis side of delaybridge. It is safe for concurrent use.
type Store struct {
	rdb        redis.UniversalClient
	keys       Keys
	scriptKeys sync.Map // scriptShard -> the KEYS of a script on a shard, built once
	loaded     sync.Map // runner -> true once loaded (runCalls)
	shards     int
	maxDead    int // dead messages kept per shard
	// maxSeries is limits.max_series (0: no bound)
	maxSeries int64
	// sourceSeries is a source's ingest[].max_series (absent: no bound of
	// its own)
	sourceSeries map[string]int64
	dedupe       time.Duration
	noFlags      bool // the Redis cannot read script flags (before 7.0, miniredis)
	// noFunctions: the hot path's scripts run as scripts, not functions
	// (Options.NoFunctions, or a Redis that refused a load or an FCALL:
	// functionsRefused).
	noFunctions atomic.Bool
	// loadFailed is when a library last could not be loaded for a reason
	// that may pass (Unix ns): the hot path runs as scripts for loadRetry.
	loadFailed atomic.Int64
	commitLead time.Duration
	observe    func(op string, d time.Duration, err error)
	codec      envelope.Codec
	cursor     cursorCache // the deployment's cursor key (browse.go)
	// layouts is the layout each shard is in, as this Store last found it
	// (layout.go): its scripts run in that layout's form, and one that
	// meets the other layout's shard says so (layoutMoved) and runs again.
	layouts []atomic.Int32
	// unknown is ErrLayoutUnknown while Redis records a layout this build
	// does not know (CheckLayout, KnowsLayout, Rerecord found it): the
	// shards' scripts are not run meanwhile (refused).
	unknown atomic.Pointer[error]
	// bandsRead is bandsInUse's last answer, plus one (0: none yet).
	bandsRead atomic.Int64
}

// Options configure a Store.
type Options struct {
	Prefix string // key prefix, e.g. "delaybridge"
	Shards int    // number of shards, e.g. 16

	// DedupeWindow is how long a delivered message's ID is remembered, so
	// that a re-read of it is not parked again (scheduler.dedupe_window);
	// 0 remembers nothing.
	DedupeWindow time.Duration

	// MaxDead is the number of dead messages kept, spread over the shards
	// (ceil(MaxDead/Shards) each); beyond it the oldest of a shard are
	// deleted. 0 keeps them all.
	MaxDead int

	// MaxSeries bounds the live recurring series of the whole store
	// (limits.max_series): Park refuses a new series past it (OverSeries),
	// counting every shard's (seriesQuotas). 0: no bound.
	MaxSeries int64

	// SourceSeries bounds the live recurring series of each source named
	// (ingest[].max_series, by ingest name) the same way
	// (OverSourceSeries); a source not named has no bound of its own.
	SourceSeries map[string]int64

	// Observe, when set, is called after every script with its name,
	// duration and error (for metrics).
	Observe func(op string, d time.Duration, err error)

	// Sealer, when set, encrypts every message stored from now on (pkg/seal's
	// Keyring) and opens sealed ones; messages stored in clear still read.
	// Without it a sealed message cannot be read: Claimed.Err and Info.Err
	// say why.
	Sealer envelope.Sealer
	// RequireSealed refuses messages found in clear (envelope.Codec).
	RequireSealed bool

	// CommitLead is how long before its due instant Commit puts a message
	// claimed ahead in flight; zero: DefaultCommitLead, which is what a
	// deployment runs with (a test takes a longer one to act inside it).
	CommitLead time.Duration

	// NoScriptFlags is for a Redis that cannot read Lua script flags (Redis
	// before 7.0, and miniredis in `delaybridge dev`): the firing scripts run
	// without allow-oom, so at maxmemory firing stops with ingest. See
	// ScriptFlagsSupported.
	NoScriptFlags bool

	// NoFunctions runs the scripts marked "function" as scripts (EVALSHA)
	// on a Redis that has functions too (a benchmark's comparison).
	NoFunctions bool
}

// New returns a Store on rdb (a *redis.Client or *redis.ClusterClient).
//
// Options carry no defaults of their own (config.ApplyDefaults has them):
// New panics when Prefix is empty or Shards is not positive.
func New(rdb redis.UniversalClient, o Options) *Store {
	if o.Shards <= 0 || o.Prefix == "" {
		panic(fmt.Sprintf("store.New: Options.Prefix (%q) and Options.Shards (%d) are required", o.Prefix, o.Shards))
	}
	perShard := math.MaxInt32 // MaxDead 0: keep every dead message
	if o.MaxDead > 0 {
		perShard = (o.MaxDead + o.Shards - 1) / o.Shards
	}
	s := &Store{rdb: rdb, keys: NewKeys(o.Prefix), shards: o.Shards, maxDead: perShard, dedupe: o.DedupeWindow, observe: o.Observe,
		codec: envelope.Codec{Sealer: o.Sealer, RequireSealed: o.RequireSealed}, noFlags: o.NoScriptFlags, commitLead: o.CommitLead}
	s.noFunctions.Store(o.NoFunctions)
	if s.commitLead <= 0 {
		s.commitLead = DefaultCommitLead
	}
	s.layouts = make([]atomic.Int32, o.Shards)
	for i := range s.layouts {
		s.layouts[i].Store(int32(newLayout))
	}
	s.maxSeries = max(o.MaxSeries, 0)
	for src, n := range o.SourceSeries {
		if n > 0 {
			if s.sourceSeries == nil {
				s.sourceSeries = map[string]int64{}
			}
			s.sourceSeries[src] = n
		}
	}
	return s
}

// ScriptFlagsSupported reports whether rdb runs scripts with a
// "#!lua flags=" line (Redis 7.0 and later): false when Redis answers it
// cannot compile the script. Anything else says nothing of the version and
// is an error: no answer, a refusal that passes by itself (a failover:
// Passing), the user's rights (NOPERM), or a refusal of a write (Redis 7
// takes a script with flags and without no-writes for one: MISCONF, a
// failing snapshot; NOREPLICAS; BUSY, another script running).
func ScriptFlagsSupported(ctx context.Context, rdb redis.UniversalClient) (bool, error) {
	err := rdb.Eval(ctx, "#!lua flags=allow-oom\nreturn 1", nil).Err()
	var reply redis.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &reply) && strings.Contains(err.Error(), "Error compiling script"):
		return false, nil
	}
	return false, fmt.Errorf("store: try a script with flags: %w", err)
}

// Shards returns the shard count.
func (s *Store) Shards() int { return s.shards }

// Keys returns the key builder.
func (s *Store) Keys() Keys { return s.keys }

// ShardOf returns the shard of a message ID.
func (s *Store) ShardOf(id string) int { return ShardOf(id, s.shards) }

// Client returns the Redis client.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// CheckShards records the shard count in Redis on first start and refuses
// to run with another one, which would strand every parked message in shards
// nobody reads. A count it records is in the form of the layout Redis
// records (shardsRecord); one recorded already is left as it is (builds of
// layout 2 before the form read the count alone: `migrate up` writes the
// form).
func (s *Store) CheckShards(ctx context.Context) error {
	key := s.keys.Config()
	v, err := checkShardsScript.Run(ctx, s.rdb, []string{key}, shardsRecord(s.shards, Layout1), shardsRecord(s.shards, Layout2)).Text()
	if err != nil {
		return fmt.Errorf("store: record shard count in %s: %w", key, err)
	}
	if n := recordedShards(v); n != strconv.Itoa(s.shards) {
		return fmt.Errorf("%w: redis.shards is %d but %s says %s; set redis.shards: %s (or use another redis.key_prefix)",
			ErrShardMismatch, s.shards, key, n, n)
	}
	return nil
}

// checkShardsScript is CheckShards', in one step so that a migrate's
// change of the layout and of the record's form never crosses it.
//
//	KEYS[1] -> the deployment's config hash (Keys.Config)
//	ARGV[1] -> the record of this store's shard count in layout 1; ARGV[2]
//	           in layout 2 (shardsRecord)
//	returns -> the shards field as Redis then holds it
var checkShardsScript = redis.NewScript(`
local l = tonumber(redis.call('HGET', KEYS[1], 'layout') or '')
if l and l >= 2 then
  redis.call('HSETNX', KEYS[1], 'shards', ARGV[2])
else
  redis.call('HSETNX', KEYS[1], 'shards', ARGV[1])
end
return redis.call('HGET', KEYS[1], 'shards')
`)

// Unguarded reports whether Redis records layout 2 or later with the shard
// count alone, as this round's builds before shardsRecord recorded it: the
// previous release would then start on the store instead of refusing it
// (`migrate up`, run again, records the form and converts nothing).
func (s *Store) Unguarded(ctx context.Context) (bool, error) {
	v, err := s.rdb.HMGet(ctx, s.keys.Config(), "layout", "shards").Result()
	if err != nil {
		return false, fmt.Errorf("store: read %s: %w", s.keys.Config(), err)
	}
	layout, _ := v[0].(string)
	shards, _ := v[1].(string)
	l, _ := strconv.Atoi(layout)
	return l >= Layout2 && shards != "" && recordedShards(shards) == shards, nil
}

// shardsRecord is how the shard count n is recorded for a store in
// layout: the count alone in layout 1, which the previous release reads;
// in a later layout the count and a sentence. The previous release reads
// no layout, but compares this field with its own count before it touches
// anything, and refuses to start on what it does not match, quoting it: so
// it meets a store it cannot read with an error that says what to do, not
// by guessing.
func shardsRecord(n, layout int) string {
	if layout <= Layout1 {
		return strconv.Itoa(n)
	}
	return fmt.Sprintf("%d (store layout %d: run `delaybridge migrate down` of a newer release before this one)", n, layout)
}

// recordedShards is the shard count a value of the shards field records
// (shardsRecord), as it is written: its leading digits.
func recordedShards(v string) string {
	end := 0
	for end < len(v) && v[end] >= '0' && v[end] <= '9' {
		end++
	}
	if end == 0 {
		return v
	}
	return v[:end]
}

// ErrEvictionPolicy is returned by CheckEviction when Redis may delete
// parked messages to make room.
var ErrEvictionPolicy = errors.New("store: redis maxmemory-policy lets Redis delete parked messages")

// CheckEviction reads every master's maxmemory-policy. An allkeys-* policy
// lets Redis delete parked messages under memory pressure, silently: it is
// an error. A volatile-* one can only evict keys with a time to live, the
// dedupe window's buckets, which costs duplicates (a re-read is parked again), not
// messages: it is a warning. noeviction, or a Redis that refuses CONFIG (a
// managed one), is fine.
func (s *Store) CheckEviction(ctx context.Context) (warning string, err error) {
	var mu sync.Mutex
	check := func(ctx context.Context, c *redis.Client) error {
		res, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return nil // CONFIG may be disabled: nothing to tell
		}
		p := res["maxmemory-policy"]
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasPrefix(p, "allkeys-"):
			return fmt.Errorf("%w: %s has maxmemory-policy %s; set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf)",
				ErrEvictionPolicy, c.Options().Addr, p)
		case strings.HasPrefix(p, "volatile-"):
			warning = fmt.Sprintf("%s has maxmemory-policy %s: under memory pressure Redis may delete the dedupe window's buckets (scheduler.dedupe_window), and re-read messages are then delivered twice; set maxmemory-policy noeviction", c.Options().Addr, p)
		}
		return nil
	}
	err = s.ForEachMaster(ctx, check)
	return warning, err
}

// ForEachMaster calls fn, concurrently, once for each Redis master that
// holds a key of this store: on a single Redis (or through Sentinel) the
// one; on a cluster the masters of its shards and of its deployment-wide
// hashes (config, sinks), by the slots as the client last read them
// (daemon.ClusterReload rereads them every 2 s). go-redis's own
// ForEachMaster first reads the slots again from a node taken at random,
// at each call, and one that hangs (a replica too) held the caller until
// its deadline: a health check answered 503 for a healthy cluster. It
// returns the first error.
func (s *Store) ForEachMaster(ctx context.Context, fn func(ctx context.Context, c *redis.Client) error) error {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		c, ok := s.rdb.(*redis.Client)
		if !ok {
			return fmt.Errorf("store: a Redis client of type %T", s.rdb)
		}
		return fn(ctx, c)
	}
	keys := []string{s.keys.Config(), s.keys.Sinks()}
	for sh := range s.shards {
		keys = append(keys, s.keys.Pool(sh))
	}
	masters := map[string]*redis.Client{}
	for _, k := range keys {
		c, err := cc.MasterForKey(ctx, k)
		if err != nil {
			return fmt.Errorf("store: the master of %s: %w", k, err)
		}
		masters[c.Options().Addr] = c
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(masters))
	for _, c := range masters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, c); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Ping checks the connection.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// form returns the form of sc for the layout shard is in.
func (s *Store) form(sc *script, shard int) *scriptForm {
	return sc.forms[s.layouts[shard].Load()-1]
}

// run executes a script on one shard, with the keys it names
// (Keys.scriptKeys).
func (s *Store) run(ctx context.Context, op string, sc *script, shard int, args ...any) *redis.Cmd {
	return s.runKeys(ctx, op, sc, shard, nil, args...)
}

// runKeys is run with more keys after the script's, from KEYS[NKEYS+1]
// (the dedupe window's buckets, and the done keys of its messages).
func (s *Store) runKeys(ctx context.Context, op string, sc *script, shard int, extra []string, args ...any) *redis.Cmd {
	start := time.Now()
	cmd := s.evalOn(ctx, sc, shard, extra, args...)
	if s.observe != nil {
		s.observe(op, time.Since(start), ignoreNil(cmd.Err()))
	}
	return cmd
}

// runDeployment runs a script whose keys are the deployment's (sinks,
// rate), given in its KEYS order: it reads no shard, and so no layout.
func (s *Store) runDeployment(ctx context.Context, op string, sc *script, keys []string, args ...any) *redis.Cmd {
	if err := s.refused(); err != nil {
		return errCmd(ctx, err) // what the deployment's keys hold may be the unknown layout's too
	}
	start := time.Now()
	f := sc.forms[0]
	cmd := s.eval(ctx, s.pick(f), s.keys.scriptKeys(f, 0, keys...), args...)
	if s.observe != nil {
		s.observe(op, time.Since(start), ignoreNil(cmd.Err()))
	}
	return cmd
}

type shardCall struct {
	shard int
	keys  []string // more keys after the script's, from KEYS[NKEYS+1]
	args  []any
}

// call is a shardCall of a script, for runCalls.
type call struct {
	sc *script
	shardCall
}

// runCalls runs calls of any scripts in one pipeline (one round trip on a
// single Redis; one per node on a cluster), in order, as runEach does for
// one script.
func (s *Store) runCalls(ctx context.Context, op string, calls []call) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	if len(calls) == 0 {
		return cmds
	}
	start := time.Now()
	if err := s.refused(); err != nil {
		for i := range cmds {
			cmds[i] = errCmd(ctx, err)
		}
	} else if len(calls) == 1 {
		c := calls[0]
		cmds[0] = s.evalOn(ctx, c.sc, c.shard, c.keys, c.args...)
	} else {
		// Loaded first: a call that meets NOSCRIPT runs again after the
		// pipeline, out of its order (a settlement after the claim that
		// was to see it); that costs a round, not a message, and happens
		// only after Redis forgot the scripts (a restart, a new master).
		for _, c := range calls {
			s.load(ctx, s.form(c.sc, c.shard))
		}
		pipe := s.rdb.Pipeline()
		for i, c := range calls {
			f := s.form(c.sc, c.shard)
			cmds[i] = s.pick(f).EvalSha(ctx, pipe, s.keysOf(f, c.shard, c.keys), c.args...)
		}
		_, _ = pipe.Exec(ctx) // errors are read per command below
		for i, c := range calls {
			if err := cmds[i].Err(); err != nil && (runAgain(err) || s.fcallRefused(err) || s.layoutMoved(err, c.shard)) {
				cmds[i] = s.evalOn(ctx, c.sc, c.shard, c.keys, c.args...)
			}
		}
	}
	s.observeAll(op, start, cmds)
	return cmds
}

// observeAll reports a pipeline of script calls begun at start to the
// Observe hook, with the first error among them.
func (s *Store) observeAll(op string, start time.Time, cmds []*redis.Cmd) {
	if s.observe == nil {
		return
	}
	var err error
	for _, c := range cmds {
		if e := ignoreNil(c.Err()); e != nil {
			err = e
			break
		}
	}
	s.observe(op, time.Since(start), err)
}

// keysOf returns the KEYS of a call of f on shard, built once per form
// and shard.
func (s *Store) keysOf(f *scriptForm, shard int, extra []string) []string {
	v, ok := s.scriptKeys.Load(scriptShard{f, shard})
	if !ok {
		v, _ = s.scriptKeys.LoadOrStore(scriptShard{f, shard}, s.keys.scriptKeys(f, shard))
	}
	keys := v.([]string)
	if len(extra) == 0 {
		return keys
	}
	return append(slices.Clip(keys), extra...)
}

type scriptShard struct {
	f     *scriptForm
	shard int
}

// Node names the Redis node that serves a shard now: on a cluster its
// master's address, as the client's view of the slots has it (a slot that
// moves takes its shard to another node); "" on a single Redis or
// Sentinel's master, and when the cluster's slots cannot be read.
func (s *Store) Node(ctx context.Context, shard int) string {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	c, err := cc.MasterForKey(ctx, s.keys.Lease(shard))
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// runEach runs one script per call in a single pipeline (one round trip on
// a single Redis; one per node on a cluster). A call that hit NOSCRIPT or a
// slot on the move (runAgain), or whose FCALL Redis refused (fcallRefused:
// functions are off then), is run again on its own.
func (s *Store) runEach(ctx context.Context, op string, sc *script, calls []shardCall) []*redis.Cmd {
	start := time.Now()
	cmds := make([]*redis.Cmd, len(calls))
	if err := s.refused(); err != nil {
		for i := range cmds {
			cmds[i] = errCmd(ctx, err)
		}
	} else if len(calls) == 1 {
		cmds[0] = s.evalOn(ctx, sc, calls[0].shard, calls[0].keys, calls[0].args...)
	} else {
		pipe := s.rdb.Pipeline()
		for i, c := range calls {
			f := s.form(sc, c.shard)
			cmds[i] = s.pick(f).EvalSha(ctx, pipe, s.keysOf(f, c.shard, c.keys), c.args...)
		}
		_, _ = pipe.Exec(ctx) // errors are read per command below
		for i, c := range calls {
			if err := cmds[i].Err(); err != nil && (runAgain(err) || s.fcallRefused(err) || s.layoutMoved(err, c.shard)) {
				cmds[i] = s.evalOn(ctx, sc, c.shard, c.keys, c.args...)
			}
		}
	}
	s.observeAll(op, start, cmds)
	return cmds
}

// load loads f into Redis (every master of a cluster) once per Store.
func (s *Store) load(ctx context.Context, f *scriptForm) {
	rs := s.pick(f)
	if _, done := s.loaded.Load(rs); done {
		return
	}
	if rs.Load(ctx, s.rdb).Err() == nil {
		s.loaded.Store(rs, true)
	}
}

// runAgain reports whether a script call of a pipeline is run again on its
// own: the script was not loaded (a restarted or flushed Redis), or its
// shard's slot was moving (TRYAGAIN) or has moved (MOVED, ASK: a pipeline
// follows none of them; a call on its own follows them all).
func runAgain(err error) bool {
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	return moved || ask || redis.HasErrorPrefix(err, "NOSCRIPT") || functionMissing(err) || redis.IsTryAgainError(err)
}

// tryAgainFor bounds how long a script is run again while Redis Cluster
// answers TRYAGAIN: its shard's slot is being moved to another master
// (resharding), and the keys it names are split between the two until the
// move ends, which takes milliseconds to seconds.
const tryAgainFor = 10 * time.Second

// eval runs sc (loading it on NOSCRIPT, as Script.Run does), and runs it
// again with back-off while Redis Cluster answers that its shard's slot is
// moving or has moved (runAgain: the client follows a redirect only so
// often, and a script loaded on the old master is not on the new one),
// until it runs, ctx ends or tryAgainFor has passed: a move of the shard's
// slot is not an error of the script.
func (s *Store) eval(ctx context.Context, sc runner, keys []string, args ...any) *redis.Cmd {
	bo := lifecycle.Backoff{Min: 5 * time.Millisecond, Max: 200 * time.Millisecond}
	deadline := time.Now().Add(tryAgainFor)
	for {
		cmd := sc.Run(ctx, s.rdb, keys, args...)
		if err := cmd.Err(); err == nil || !runAgain(err) || time.Now().After(deadline) {
			return cmd
		}
		if !bo.Wait(ctx, nil) {
			return cmd
		}
	}
}

// evalOn runs sc on shard in the form of the layout the shard is in: one
// that meets the other layout's shard (layoutMoved: a migrate ran since
// this Store last looked) runs again in that layout's form.
func (s *Store) evalOn(ctx context.Context, sc *script, shard int, extra []string, args ...any) *redis.Cmd {
	if err := s.refused(); err != nil {
		return errCmd(ctx, err)
	}
	for range LayoutNewest {
		f := s.form(sc, shard)
		cmd := s.eval(ctx, s.pick(f), s.keysOf(f, shard, extra), args...)
		if err := cmd.Err(); err == nil || !s.layoutMoved(err, shard) {
			return cmd
		}
	}
	f := s.form(sc, shard)
	return s.eval(ctx, s.pick(f), s.keysOf(f, shard, extra), args...)
}

// refused is ErrLayoutUnknown, with what to do, while Redis records a
// layout this build does not know: no script is run then (a shard's would
// read and write it as a layout it may not be in), nor a sink paused or
// resumed.
func (s *Store) refused() error {
	if p := s.unknown.Load(); p != nil {
		return *p
	}
	return nil
}

// noteLayout remembers whether err, a reading of the layout Redis records,
// found one this build does not know (refused).
func (s *Store) noteLayout(err error) {
	if errors.Is(err, ErrLayoutUnknown) {
		s.unknown.Store(&err)
	} else if err == nil {
		s.unknown.Store(nil)
	}
}

// errCmd is a command that failed with err before it was sent.
func errCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// layoutMoved reports whether err is a script's refusal of a shard in the
// other layout (lua/lib/due.lua, lua/lib/due2.lua), and if so takes that layout
// for the shard.
func (s *Store) layoutMoved(err error, shard int) bool {
	switch {
	case redis.HasErrorPrefix(err, "LAYOUT the shard is in layout 2"):
		s.layouts[shard].Store(Layout2)
	case redis.HasErrorPrefix(err, "LAYOUT the shard is in layout 1"):
		s.layouts[shard].Store(Layout1)
	default:
		return false
	}
	return true
}

func ignoreNil(err error) error {
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// meta decodes the meta value v of the message id (parseMeta), its reason
// opened when it is sealed (envelope.Codec.OpenReason; one that cannot be
// opened reads as a sentence that says why).
func (s *Store) meta(id, v string) (attempts int, deadAt int64, reason string) {
	attempts, deadAt, reason = parseMeta(v)
	reason, _ = s.codec.OpenReason(id, reason)
	return attempts, deadAt, reason
}

// parseMeta decodes a meta value (see luaMeta); its reason as stored
// (sealed with encryption: Store.meta opens it).
func parseMeta(v string) (attempts int, deadAt int64, reason string) {
	p := strings.SplitN(v, "|", 4)
	if len(p) != 4 {
		return 0, 0, ""
	}
	attempts, _ = strconv.Atoi(p[0])
	deadAt, _ = strconv.ParseInt(p[1], 10, 64)
	return attempts, deadAt, p[3]
}

// ms converts a time to Unix milliseconds.
func ms(t time.Time) int64 { return t.UnixMilli() }

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	}
	return "", false
}

// encode is the store's codec's Encode (sealed when it has a Sealer) into a
// fresh buffer.
func (s *Store) encode(m *envelope.Message) []byte {
	return s.codec.Encode(make([]byte, 0, envelope.EncodedSize(m)), m)
}

// decode is the store's codec's DecodeString: the blob as Redis answered it.
func (s *Store) decode(id string, blob string) (*envelope.Message, error) {
	return s.codec.DecodeString(id, blob)
}

// Passing reports whether err is Redis refusing a command for a state that
// passes by itself: a failover (a master down, a write to a master just
// made a replica), a cluster without a master for some slots, a slot
// moving, a dataset being loaded. The command did nothing; asked again in a
// moment, it runs.
func Passing(err error) bool {
	return redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsLoadingError(err) ||
		redis.IsMasterDownError(err) || redis.IsReadOnlyError(err)
}

// Unreachable reports whether err says this process cannot reach Redis (a
// refused, reset or timed-out connection, a pool that cannot connect) as
// opposed to Redis answering with an error (full, loading, a failover, a
// cluster moving slots), which every instance sees alike. An instance cut
// off from Redis hands its ingest work back to the others (pkg/ingest).
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	var re redis.Error
	switch {
	case errors.As(err, &re):
		return false // Redis answered
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
		return true
	}
	return false
}
