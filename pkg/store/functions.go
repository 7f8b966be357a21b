package store

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// runner runs one form of a script: a redis.Script (EVALSHA, EVAL when
// Redis does not have it), or a function (fcall).
type runner interface {
	// Run runs it, loading it first when Redis does not have it.
	Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd
	// EvalSha runs it as loaded, for a pipeline: a call that finds it not
	// loaded fails (runAgain), and is run again on its own.
	EvalSha(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd
	// Load loads it into Redis (every master of a cluster).
	Load(ctx context.Context, c redis.Scripter) *redis.StringCmd
}

// fcall runs a script's function form (luaFunction) with FCALL. Redis keeps
// a loaded library in its data (replicated, persisted with it), so that a
// restarted or promoted server has it still; one that does not (a new
// master, FUNCTION FLUSH, a Redis that came back empty) answers "Function
// not found", and Run loads it, on every master, and calls it again. Where
// it cannot be loaded (no FUNCTION command or no right to it: functions are
// then off for the Store; maxmemory reached, a failover: the Store's hot
// path runs as scripts for loadRetry before it tries again), or where FCALL
// itself is refused (an ACL written for scripts: off for the Store), the
// script form runs instead: a function is a saving, never a condition.
type fcall struct {
	s *Store
	f *scriptForm
}

// caller is what runs an FCALL: a client or a pipeline.
type caller interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
}

func (r fcall) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	cmd := r.EvalSha(ctx, c, keys, args...)
	switch err := cmd.Err(); {
	case r.s.fcallRefused(err):
	case !functionMissing(err):
		return cmd
	case r.s.loadFunction(ctx, r.f.fn) == nil:
		if cmd = r.EvalSha(ctx, c, keys, args...); !functionMissing(cmd.Err()) && !r.s.fcallRefused(cmd.Err()) {
			return cmd
		}
	}
	return r.s.script(r.f).Run(ctx, c, keys, args...)
}

func (r fcall) EvalSha(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	fc, ok := c.(caller)
	if !ok {
		return r.s.script(r.f).EvalSha(ctx, c, keys, args...)
	}
	return fc.FCall(ctx, r.f.fn.name, keys, args...)
}

func (r fcall) Load(ctx context.Context, _ redis.Scripter) *redis.StringCmd {
	cmd := redis.NewStringCmd(ctx)
	if err := r.s.loadFunction(ctx, r.f.fn); err != nil {
		cmd.SetErr(err)
	} else {
		cmd.SetVal(r.f.fn.name)
	}
	return cmd
}

// functionMissing reports whether Redis answered that it has no such
// function.
func functionMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// fcallRefused reports whether err is Redis refusing FCALL itself (no right
// to it, or a server or proxy that does not know it), and turns functions
// off for the Store then.
func (s *Store) fcallRefused(err error) bool {
	if !functionsRefused(err) {
		return false
	}
	s.noFunctions.Store(true)
	return true
}

// loadRetry is how long the hot path runs as scripts after a library could
// not be loaded for a reason that may pass (maxmemory, a failover), before
// a call tries again: not a load attempt and a failed FCALL per call
// meanwhile.
const loadRetry = 10 * time.Second

// loadFunction loads fn's library on every master (one loaded already is
// left as it is). A Redis without functions, or a user who may not load
// one, turns them off for the Store: its scripts run as scripts from then
// on. Another failure holds them off for loadRetry.
func (s *Store) loadFunction(ctx context.Context, fn *luaFunction) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, fn.code).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	} else {
		err = load(ctx, s.rdb)
	}
	switch {
	case functionsRefused(err):
		s.noFunctions.Store(true)
	case err != nil:
		s.loadFailed.Store(time.Now().UnixNano())
	}
	return err
}

// functionsRefused reports whether err says that this Redis or this user
// has no functions: a command or subcommand it does not know (before 7.0,
// a proxy), or no right to it (an ACL without FUNCTION).
func functionsRefused(err error) bool {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand")
}

// pick returns how this Store runs f: as a function where f has that form
// and Redis functions are on, else as a script.
func (s *Store) pick(f *scriptForm) runner {
	if f.fn != nil && !s.noFlags && !s.noFunctions.Load() && time.Since(time.Unix(0, s.loadFailed.Load())) >= loadRetry {
		return fcall{s, f}
	}
	return s.script(f)
}

// script returns the script form of f this Store's Redis runs.
func (s *Store) script(f *scriptForm) *redis.Script {
	if s.noFlags {
		return f.plain
	}
	return f.flagged
}
