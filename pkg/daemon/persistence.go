package daemon

// Redis's persistence settings, read beside its eviction policy
// (store.CheckEviction): a Redis with neither AOF nor RDB snapshots loses
// every parked message when it restarts, and nothing else would say so.
//
// The daemon reads them at its start, again at each reconnect (a new
// connection to Redis wakes the watch; what it reads is said again when
// Redis restarted or another master took over, which INFO's run_id tells,
// or when Redis could not be reached in between), and every minute, so that
// a CONFIG SET made meanwhile shows. With neither AOF nor RDB on a master it
// logs a WARN naming what to set; /readyz lists the warning (still 200),
// GET /v1/stats has it as "redis_persistence", the dashboard shows it, and
// `delaybridge validate --live` reports it.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

const (
	// persistenceRefresh is how often the watch reads the settings again
	// without a reconnect.
	persistenceRefresh = time.Minute
	// persistenceMinGap spaces the reads that new connections ask for: a
	// pool opening ten connections is one reconnect.
	persistenceMinGap = time.Second
)

// PersistenceAdvice is what a warning asks for.
const PersistenceAdvice = "set appendonly yes and appendfsync everysec (in redis.conf, or CONFIG SET appendonly yes, " +
	"CONFIG SET appendfsync everysec and CONFIG REWRITE)"

// MasterPersistence is what one Redis master keeps on disk.
type MasterPersistence struct {
	Addr  string // as the client reaches it; through Sentinel, the master it names
	RunID string // INFO server's run_id: another one is a restart or another master
	AOF   bool   // appendonly yes
	RDB   bool   // save has at least one rule
	// Err is why CONFIG GET was refused (a managed Redis, an ACL without
	// +config): AOF and RDB are then unknown.
	Err error
}

// None reports whether the master is known to keep nothing on disk.
func (m MasterPersistence) None() bool { return m.Err == nil && !m.AOF && !m.RDB }

// Persistence is what every master keeps on disk.
type Persistence struct {
	Masters []MasterPersistence // by address
	At      time.Time           // when it was read
}

// PersistenceName is what ReadPersistence calls the master of a Sentinel
// configuration (the one it reaches has no address of its own in the
// client); "" for the others, whose masters are named by address.
func PersistenceName(rc config.Redis) string {
	if len(rc.SentinelAddrs) == 0 {
		return ""
	}
	return redisAddr(rc)
}

// ReadPersistence reads CONFIG GET appendonly, CONFIG GET save and INFO
// server's run_id on every master of a Redis Cluster that holds the store's
// keys (store.ForEachMaster), else on the one server the client talks to
// (through Sentinel, the master it names, called name here). A master that
// refuses CONFIG is unknown, not an error: the error is one of reaching
// Redis.
func ReadPersistence(ctx context.Context, st *store.Store, name string) (Persistence, error) {
	p := Persistence{At: time.Now()}
	_, cluster := st.Client().(*redis.ClusterClient)
	var mu sync.Mutex
	err := st.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		addr := c.Options().Addr
		if name != "" && !cluster {
			addr = name
		}
		m, err := readMaster(ctx, c, addr)
		if err != nil {
			return fmt.Errorf("redis %s: read the persistence settings: %w", addr, err)
		}
		mu.Lock()
		p.Masters = append(p.Masters, m)
		mu.Unlock()
		return nil
	})
	slices.SortFunc(p.Masters, func(a, b MasterPersistence) int { return strings.Compare(a.Addr, b.Addr) })
	return p, err
}

// readMaster reads one master in one round trip.
func readMaster(ctx context.Context, c *redis.Client, addr string) (MasterPersistence, error) {
	m := MasterPersistence{Addr: addr}
	var aof, save *redis.MapStringStringCmd
	var info *redis.StringCmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		aof = p.ConfigGet(ctx, "appendonly")
		save = p.ConfigGet(ctx, "save")
		info = p.Info(ctx, "server")
		return nil
	})
	for _, err := range []error{aof.Err(), save.Err(), info.Err()} {
		var reply redis.Error
		if err != nil && !errors.As(err, &reply) {
			return m, err // not Redis's answer: Redis was not reached
		}
	}
	if info.Err() == nil {
		for _, line := range strings.Split(info.Val(), "\n") {
			if v, ok := strings.CutPrefix(line, "run_id:"); ok {
				m.RunID = strings.TrimSpace(v)
			}
		}
	}
	switch {
	case aof.Err() != nil:
		m.Err = aof.Err()
	case save.Err() != nil:
		m.Err = save.Err()
	default:
		a, okA := aof.Val()["appendonly"]
		s, okS := save.Val()["save"]
		if !okA || !okS {
			m.Err = errors.New("CONFIG GET answered without appendonly or save")
			break
		}
		m.AOF = a == "yes"
		m.RDB = strings.TrimSpace(s) != ""
	}
	return m, nil
}

// Warning names the masters that keep nothing on disk and what to set; ""
// when there is none.
func (p Persistence) Warning() string {
	var none []string
	for _, m := range p.Masters {
		if m.None() {
			none = append(none, m.Addr)
		}
	}
	switch len(none) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf("%s keeps nothing on disk (appendonly no, save \"\"): when it restarts every parked message is lost; %s",
			none[0], PersistenceAdvice)
	}
	return fmt.Sprintf("%s keep nothing on disk (appendonly no, save \"\"): when one restarts its parked messages are lost; %s on each",
		strings.Join(none, ", "), PersistenceAdvice)
}

// Unknown says which masters refused CONFIG and why; "" when every one
// answered.
func (p Persistence) Unknown() string {
	var out []string
	for _, m := range p.Masters {
		if m.Err != nil {
			out = append(out, fmt.Sprintf("%s refused CONFIG GET (%v)", m.Addr, m.Err))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "; ") + ": whether Redis keeps what it holds across a restart is unknown; make sure it has appendonly yes"
}

// Kinds reports whether every master has AOF and whether every one has RDB
// snapshots; nil when unknown (a master refused CONFIG, and no other is
// known to lack it).
func (p Persistence) Kinds() (aof, rdb *bool) {
	all := func(has func(MasterPersistence) bool) *bool {
		if len(p.Masters) == 0 {
			return nil
		}
		unknown := false
		for _, m := range p.Masters {
			switch {
			case m.Err != nil:
				unknown = true
			case !has(m):
				return new(false)
			}
		}
		if unknown {
			return nil
		}
		return new(true)
	}
	return all(func(m MasterPersistence) bool { return m.AOF }), all(func(m MasterPersistence) bool { return m.RDB })
}

// Describe is the reading in words, for `validate --live`: one line per
// master.
func (p Persistence) Describe() []string {
	onOff := func(b bool) string { return map[bool]string{true: "on", false: "off"}[b] }
	var out []string
	for _, m := range p.Masters {
		if m.Err != nil {
			out = append(out, fmt.Sprintf("redis %s: persistence unknown: CONFIG GET refused (%v)", m.Addr, m.Err))
			continue
		}
		out = append(out, fmt.Sprintf("redis %s: persistence: AOF %s, RDB snapshots %s", m.Addr, onOff(m.AOF), onOff(m.RDB)))
	}
	return out
}

// View is the reading as GET /v1/stats shows it.
func (p Persistence) View() *ops.PersistenceView {
	v := &ops.PersistenceView{Warning: p.Warning(), Unknown: p.Unknown()}
	v.AOF, v.RDB = p.Kinds()
	if !p.At.IsZero() {
		v.CheckedAt = envelope.FormatTime(p.At)
	}
	return v
}

// identity is what a reading says worth saying again when it changes: the
// masters, their run IDs and settings.
func (p Persistence) identity() string {
	var b strings.Builder
	for _, m := range p.Masters {
		fmt.Fprintf(&b, "%s|%s|%t|%t|%t;", m.Addr, m.RunID, m.AOF, m.RDB, m.Err != nil)
	}
	return b.String()
}

// persistenceWatch keeps the last reading and says what it finds.
type persistenceWatch struct {
	st   *store.Store
	name string // the master's name through Sentinel, else ""
	log  *slog.Logger
	kick chan struct{} // a new connection to Redis was made
	// lost is set when Redis could not be reached since the last reading:
	// the next one is a reconnect, said again even when nothing changed.
	lost atomic.Bool

	// record, when set, runs after each reading (keepRecord): what else
	// a Redis that restarted empty has lost.
	record func(context.Context)

	mu   sync.Mutex
	last *Persistence
	err  error // of the last try, when it failed
}

func newPersistenceWatch(name string, log *slog.Logger) *persistenceWatch {
	return &persistenceWatch{name: name, log: log, kick: make(chan struct{}, 1)}
}

// connected is the Redis client's OnConnect: a new connection, maybe a
// reconnect, wakes the watch. It never blocks.
func (w *persistenceWatch) connected(context.Context, *redis.Conn) error {
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return nil
}

// disconnected records that Redis could not be reached (a failed probe).
func (w *persistenceWatch) disconnected() { w.lost.Store(true) }

// check reads the settings and logs them when they are new: at the first
// reading, after a reconnect, a restart of Redis or another master, or a
// change.
func (w *persistenceWatch) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := ReadPersistence(ctx, w.st, w.name)
	if err != nil {
		w.lost.Store(true)
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		if ctx.Err() == nil {
			w.log.Debug("cannot read redis's persistence settings; trying again at the next reconnect", "err", err)
		}
		return
	}
	if w.record != nil {
		w.record(ctx)
	}
	reconnected := w.lost.Swap(false)
	w.mu.Lock()
	prev := w.last
	w.last, w.err = &p, nil
	w.mu.Unlock()
	if prev != nil && !reconnected && prev.identity() == p.identity() {
		return // said already
	}
	switch warning, unknown := p.Warning(), p.Unknown(); {
	case warning != "":
		w.log.Warn("redis: " + warning)
	case prev != nil && prev.Warning() != "":
		w.log.Info("redis: persistence on now", "masters", strings.Join(p.Describe(), "; "))
	case unknown != "" && (prev == nil || prev.Unknown() == ""):
		w.log.Info("redis: " + unknown)
	}
}

// run reads again at each new connection (at most once per
// persistenceMinGap) and every persistenceRefresh, until ctx ends.
func (w *persistenceWatch) run(ctx context.Context) {
	t := time.NewTicker(persistenceRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-t.C:
		}
		w.check(ctx)
		select { // spacing of the reads, not a wait for an event
		case <-ctx.Done():
			return
		case <-time.After(persistenceMinGap):
		}
	}
}

// view is the last reading for GET /v1/stats; Unknown says why when there
// is none.
func (w *persistenceWatch) view(context.Context) *ops.PersistenceView {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		v := &ops.PersistenceView{Unknown: "not read yet"}
		if w.err != nil {
			v.Unknown = "not read yet: " + w.err.Error()
		}
		return v
	}
	return w.last.View()
}

// warnings are /readyz's: the warning of the last reading, if any.
func (w *persistenceWatch) warnings() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		return nil
	}
	if warning := w.last.Warning(); warning != "" {
		return []string{"redis: " + warning}
	}
	return nil
}

// kinds are the gauges' values (metrics.State.Persistence).
func (w *persistenceWatch) kinds() (aof, rdb *bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		return nil, nil
	}
	return w.last.Kinds()
}

// unreachable reports whether err is a failure to reach Redis rather than
// its answer (a script's error, a refusal) or the caller giving up.
func unreachable(err error) bool {
	var reply redis.Error
	return err != nil && !errors.As(err, &reply) && !errors.Is(err, context.Canceled)
}
