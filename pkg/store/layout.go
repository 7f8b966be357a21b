package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The layout is what the store's keys are and what they hold (keys.go,
// docs/store.md). Redis records the one it holds in the deployment's config
// hash (Keys.Config, field "layout"), so that a build meets a layout it does
// not know with an error instead of guessing: reading a layout as another
// one loses messages (a build of one layout took the messages of the next
// one for corrupt and kept them as dead).
const (
	// Layout1 is the layout of the first releases ("Version 1.0"): a
	// store they wrote records no layout; the first build that records
	// one finds the shard count there and records 1.
	Layout1 = 1
	// Layout2 shows each state of a message as a key of its own, scored by
	// a time and nothing else (lua/lib/due2.lua, docs/store.md); a shard
	// in it has its marker (Keys.LayoutMark). Store.MigrateUp converts a
	// store to it, Store.MigrateDown back.
	Layout2 = 2
	// LayoutNewest is the newest layout this build knows.
	LayoutNewest = Layout2
	// LayoutNew is the layout this build gives a store that holds nothing
	// yet. A store that holds messages keeps its layout until migrate up
	// (or down).
	LayoutNew = Layout2
)

// newLayout is LayoutNew, which a test may change (layout_internal_test.go)
// to run the package's tests in another layout.
var newLayout = LayoutNew

// ErrLayoutUnknown is returned by CheckLayout when Redis holds a layout this
// build does not know (written by a newer delaybridge).
var ErrLayoutUnknown = errors.New("store: redis holds a layout this build does not know")

// layoutScript reads the layout Redis records and records it where none
// is: Layout1 for a store written before layouts were recorded (it has the
// shard count: CheckShards), else the one given for a new store.
//
//	KEYS[1] -> the deployment's config hash (Keys.Config)
//	ARGV[1] -> the layout of a new store; "" records nothing
//	returns -> the layout, "" when none is recorded and ARGV[1] is ""
var layoutScript = redis.NewScript(`
local l = redis.call('HGET', KEYS[1], 'layout')
if l then return l end
if redis.call('HEXISTS', KEYS[1], 'shards') == 1 then l = '1' else l = ARGV[1] end
if l ~= '' and ARGV[1] ~= '' then redis.call('HSET', KEYS[1], 'layout', l) end
return l
`)

// KnowsLayout returns nil while the layout Redis records (if any) is one
// this build knows, else ErrLayoutUnknown with what to do: a newer
// delaybridge's migrate may change it while this one runs, and /readyz
// says so. It reads only.
func (s *Store) KnowsLayout(ctx context.Context) error {
	v, err := s.rdb.HGet(ctx, s.keys.Config(), "layout").Result()
	switch {
	case err == redis.Nil:
		s.noteLayout(nil)
		return nil
	case err != nil:
		return fmt.Errorf("store: read the layout from %s: %w", s.keys.Config(), err)
	}
	err = knownLayout(s.keys.Config(), v)
	s.noteLayout(err)
	return err
}

// knownLayout is nil for a layout v this build knows, else unknownLayout.
func knownLayout(config, v string) error {
	if l, err := strconv.Atoi(v); err != nil || l < Layout1 || l > LayoutNewest {
		return unknownLayout(config, v)
	}
	return nil
}

// unknownLayout is ErrLayoutUnknown for the layout v that config records.
func unknownLayout(config, v string) error {
	return fmt.Errorf("%w: %s says layout %q, and this build knows layouts %d to %d; run the delaybridge that wrote it "+
		"(or a newer one), or move the store back to a layout this build knows with that build's `delaybridge migrate down` "+
		"(docs/store.md, \"Upgrades and rollbacks\")", ErrLayoutUnknown, config, v, Layout1, LayoutNewest)
}

// Rerecord writes the shard count and layout into <prefix>:config where
// they are missing (Redis lost them while a daemon ran: it restarted
// without persistence, or was flushed), and checks what is there: another
// shard count is ErrShardMismatch, a layout this build does not know
// ErrLayoutUnknown. layout is the one the daemon found at its start: a
// store of an earlier layout stays recorded as such. It changes nothing
// the Store holds in memory, and never a value Redis has.
//
// The daemon that finds the record missing writes when (the field
// lost_at, Unix ms), so that every daemon learns that Redis lost its data,
// not only the first to look: lostAt is that time, zero when Redis never
// lost the record.
func (s *Store) Rerecord(ctx context.Context, layout int) (lostAt time.Time, err error) {
	key := s.keys.Config()
	v, err := rerecordScript.Run(ctx, s.rdb, []string{key}, shardsRecord(s.shards, layout), layout, time.Now().UnixMilli()).Slice()
	if err == nil && len(v) != 3 {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("store: record the shard count and layout in %s: %w", key, err)
	}
	shards, _ := v[0].(string)
	shards = recordedShards(shards)
	l, _ := v[1].(string)
	if lost, _ := v[2].(string); lost != "" {
		if ms, err := strconv.ParseInt(lost, 10, 64); err == nil {
			lostAt = time.UnixMilli(ms)
		}
	}
	err = knownLayout(key, l)
	s.noteLayout(err)
	if shards != strconv.Itoa(s.shards) {
		return lostAt, fmt.Errorf("%w: redis.shards is %d but %s says %s; set redis.shards: %s (or use another redis.key_prefix)",
			ErrShardMismatch, s.shards, key, shards, shards)
	}
	return lostAt, err
}

// rerecordScript is Rerecord's, in one step so that a record written again
// never goes without the time it was found missing.
//
//	KEYS[1] -> the deployment's config hash (Keys.Config)
//	ARGV[1] -> the shard count as recorded (shardsRecord); ARGV[2] the
//	           layout; ARGV[3] now, Unix ms
//	returns -> {shards, layout, lost_at} as Redis then holds them ('' none)
var rerecordScript = redis.NewScript(`
if redis.call('HSETNX', KEYS[1], 'shards', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'lost_at', ARGV[3])
end
redis.call('HSETNX', KEYS[1], 'layout', ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'shards', 'layout', 'lost_at')
return {v[1] or '', v[2] or '', v[3] or ''}
`)

// CheckLayout returns the layout Redis holds, recording LayoutNew on a
// store that holds nothing yet when record is set (a daemon's start; a
// command that only reads does not). A layout this build does not know is
// ErrLayoutUnknown, with what to do.
func (s *Store) CheckLayout(ctx context.Context, record bool) (int, error) {
	arg := ""
	if record {
		arg = strconv.Itoa(newLayout)
	}
	v, err := layoutScript.Run(ctx, s.rdb, []string{s.keys.Config()}, arg).Text()
	if err != nil {
		return 0, fmt.Errorf("store: read the layout from %s: %w", s.keys.Config(), err)
	}
	if v == "" {
		return newLayout, nil // nothing stored: any layout reads it
	}
	l, err := strconv.Atoi(v)
	if err == nil && l >= Layout1 && l <= LayoutNewest {
		// The layout each shard is taken to be in until a script finds
		// otherwise (a migrate that stopped half-way).
		for i := range s.layouts {
			s.layouts[i].Store(int32(l))
		}
	}
	if err != nil || l < Layout1 || l > LayoutNewest {
		err := unknownLayout(s.keys.Config(), v)
		s.noteLayout(err)
		return l, err
	}
	s.noteLayout(nil)
	return l, nil
}
