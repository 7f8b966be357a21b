//go:build fault

package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// previousRelease is the last commit of the release before this one: the
// daemon a rolling upgrade starts from and a rollback returns to. testenv.BuildCommit builds it from the clone's
// history (a shallow clone fails, saying `git fetch --unshallow`).
const previousRelease = "6852e23"

// previousBuild is the previous release's daemon, built once per test
// process (and, with the go build cache, linked again in seconds).
func previousBuild(t *testing.T) string {
	t.Helper()
	return testenv.BuildCommit(t, previousRelease)
}

// The two builds of the upgrade scenarios, as their notes name them.
const (
	buildPrevious = "previous"
	buildNew      = "new"
)

// upgradeTraffic is what publishers send during an upgrade scenario, beside
// the stream of messages through the ingest (delays 0-5 s): every
// postEvery-th message of the stream is POSTed to the admin API of a live
// daemon of either build instead, and a canceller publishes messages due
// in cancelLead and cancels each through the ingest (x-delay-cancel) once
// it is parked.
const (
	upgradeSeconds = 30 // the traffic's length at -scale 1
	postEvery      = 10
	cancelBase     = 900000 // publisher indexes of the cancelled messages
	cancelLead     = 8 * time.Second
	cancelPace     = 250 * time.Millisecond
)

// fleet is the daemons of an upgrade scenario, of both builds, and what
// they were sent.
type fleet struct {
	w *world
	n int // the stream's messages are [0, n)

	mu     sync.Mutex
	live   []*member // the daemons POSTs go to: started, not being stopped
	rr     int
	posted map[string]int // POSTed messages by build
	stops  []*stopRecord

	cancels        int    // cancels published through the ingest
	cancelSeqFloor uint64 // the ingest stream's last sequence when the canceller ended

	newBin, newCfg string // the new build's binary and a configuration of it (migrate)
}

// member is one daemon of a fleet.
type member struct {
	d     *daemon
	build string
	name  string
}

// stopRecord is what a graceful stop of one daemon left.
type stopRecord struct {
	m          *member
	term, exit time.Time
	code       int
	took       time.Duration
	before     redisState // just before the SIGTERM
	ackPending int        // the ingest's unacknowledged messages just before it
	after      redisState // right after the exit
	ackAfter   int        // the ingest's unacknowledged messages right after it
}

func newFleet(w *world, n int) *fleet {
	f := &fleet{w: w, n: n, posted: map[string]int{}}
	natsSend := w.pub.send
	w.pub.send = func(ctx context.Context, id string, delay time.Duration, at time.Time) error {
		i := indexOf(id)
		if i >= n || i%postEvery != 3 || !at.IsZero() {
			return natsSend(ctx, id, delay, at)
		}
		m := f.pick()
		if m == nil { // no daemon runs (a rollback between its stop and its start)
			return natsSend(ctx, id, delay, at)
		}
		if err := m.d.post(ctx, id, delay); err != nil {
			return err
		}
		f.mu.Lock()
		f.posted[m.build]++
		f.mu.Unlock()
		return nil
	}
	return f
}

// pick is the next live daemon for a POST, in turn; nil when none.
func (f *fleet) pick() *member {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.live) == 0 {
		return nil
	}
	f.rr++
	return f.live[f.rr%len(f.live)]
}

// start starts a daemon of the given binary and build and adds it to the
// daemons POSTs go to once it is ready.
func (f *fleet) start(bin, build, name string) *member {
	f.w.t.Helper()
	m := &member{d: f.w.startDaemonWith(bin), build: build, name: name}
	f.w.logf("%s (%s build) ready: pid %d", name, build, m.d.proc.Pid)
	f.mu.Lock()
	f.live = append(f.live, m)
	if build == buildNew {
		f.newBin, f.newCfg = bin, m.d.cfgPath
	}
	f.mu.Unlock()
	return m
}

// migrate runs the new build's `delaybridge migrate <dir>` on the fleet's
// Redis and returns what it printed.
func (f *fleet) migrate(dir string) string {
	f.w.t.Helper()
	f.mu.Lock()
	bin, cfg := f.newBin, f.newCfg
	f.mu.Unlock()
	out, err := exec.Command(bin, "migrate", dir, "--config", cfg).CombinedOutput()
	if err != nil {
		f.w.t.Fatalf("delaybridge migrate %s: %v\n%s", dir, err, out)
	}
	said := strings.TrimSpace(string(out))
	f.w.logf("migrate %s: %s", dir, said)
	return said
}

// stop stops m gracefully while it claims: POSTs go elsewhere first, then
// a burst of messages due 1.5 s later is published (IDs from `from` on)
// and the SIGTERM follows as soon as the burst's claims show in Redis, as
// in TestSIGTERMUnderLoad. It records the claims and the ingest's
// unacknowledged messages just before (the duplicates' bound) and the
// claims right after the exit (those of the stopped daemon among them wait
// for their lease: stopRecord.orphans).
func (f *fleet) stop(m *member, from int) *stopRecord {
	w := f.w
	w.t.Helper()
	f.mu.Lock()
	for i, l := range f.live {
		if l == m {
			f.live = append(f.live[:i], f.live[i+1:]...)
			break
		}
	}
	f.mu.Unlock()
	at := w.burst(from, 1500*time.Millisecond)
	w.atBurst(at, from)
	st := &stopRecord{m: m, before: w.redisState()}
	if is, err := w.ingestState(); err == nil {
		st.ackPending = is.ackPending
	}
	st.term = time.Now()
	st.code, st.took = m.d.term(shutdownTO + 30*time.Second)
	st.exit = time.Now()
	st.after = w.redisState()
	if is, err := w.ingestState(); err == nil {
		st.ackAfter = is.ackPending
	}
	w.logf("%s (%s build) SIGTERMed with %d claims in Redis (all daemons') and %d unacknowledged ingest messages: exit %d after %v; %d claims in Redis and %d unacknowledged ingest messages after its exit",
		m.name, m.build, st.before.inflight, st.ackPending, st.code, st.took.Round(time.Millisecond), st.after.inflight, st.ackAfter)
	if st.code != 0 {
		w.t.Errorf("%s (%s build): exit code %d after SIGTERM:\n%s", m.name, m.build, st.code, tailLines(m.d.proc.Output(), 30))
	}
	if st.took > shutdownTO {
		w.t.Errorf("%s (%s build): exit took %v, more than shutdown_timeout %v", m.name, m.build, st.took, shutdownTO)
	}
	f.mu.Lock()
	f.stops = append(f.stops, st)
	f.mu.Unlock()
	return st
}

// bound is the duplicates the stops may cause: the claims and the
// unacknowledged ingest messages in flight just before each.
func (f *fleet) bound() int {
	n := 0
	for _, st := range f.stops {
		n += st.before.inflight + st.ackPending
	}
	return n
}

// orphans are the claims a stopped daemon left to their lease: of the
// claims in Redis right after its exit (its own and the live daemons'),
// those published again by another claim after their lease expired. A
// claim in flight that is taken again after its lease counts an abandoned
// attempt, so its copy carries a higher attempt than the claim's; a claim
// ahead of its due time counts nothing, and its holder commits it before
// the lease ends (pkg/store/lua/commit.lua refuses after it) and before
// its due time (fire_ahead 100 ms, lease 2 s): its first copy comes after
// the lease only when nobody held it any more. Neither depends on the
// machine's speed.
func (st *stopRecord) orphans(copies map[string][]copyAt) []string {
	var ids []string
	for _, id := range st.after.inflightIDs {
		cs := copies[id]
		if len(cs) == 0 {
			continue
		}
		if st.after.ahead[id] {
			if !cs[0].at.Before(time.UnixMilli(st.after.leases[id])) {
				ids = append(ids, id)
			}
			continue
		}
		for _, c := range cs {
			if c.attempt > st.after.attempts[id] {
				ids = append(ids, id)
				break
			}
		}
	}
	return ids
}

// around is the lateness of the messages due around a stop: from 1 s before
// the SIGTERM to a lease and 1 s after the exit, when a claim the stop left
// would have come back.
func (st *stopRecord) around(copies map[string][]copyAt) (n int, p99, worst time.Duration) {
	lo, hi := st.term.Add(-time.Second), st.exit.Add(lease+time.Second)
	var late []time.Duration
	for _, cs := range copies {
		if len(cs) == 0 || cs[0].due.Before(lo) || cs[0].due.After(hi) {
			continue
		}
		late = append(late, cs[0].at.Sub(cs[0].due))
	}
	if len(late) == 0 {
		return 0, 0, 0
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	return len(late), late[min(len(late)-1, len(late)*99/100)], late[len(late)-1]
}

// checkStops reports, per stop, what it left to its lease and the lateness
// of the messages due around it, and fails on a claim left to its lease:
// a graceful stop hands its claims back.
func (f *fleet) checkStops() {
	w := f.w
	copies := w.col.snapshot()
	var parts []string
	for _, st := range f.stops {
		orphans := st.orphans(copies)
		n, p99, worst := st.around(copies)
		parts = append(parts, fmt.Sprintf("%s (%s build): %d claims (all daemons') and %d unacknowledged ingest messages at the SIGTERM, exit %d after %s, %d claims left to their lease; %d messages due around it, lateness p99 %s max %s",
			st.m.name, st.m.build, st.before.inflight, st.ackPending, st.code, dur(st.took), len(orphans), n, dur(p99), dur(worst)))
		if len(orphans) > 0 {
			w.t.Errorf("%s (%s build) stopped gracefully and left %d claims to their lease (published again by another claim after it expired): %v",
				st.m.name, st.m.build, len(orphans), first(orphans, 10))
		}
		if out := st.m.d.proc.Output(); strings.Contains(out, "their lease brings them back") {
			w.t.Errorf("%s (%s build) said at its stop that it left claims to their lease:\n%s", st.m.name, st.m.build, grepLines(out, "lease brings them back", 5))
		}
	}
	w.res.note("stops: %s", strings.Join(parts, "; "))
}

// post schedules a message through POST /v1/messages, to the sink "out"
// and the route's destination, with the delay in ms. Any 2xx is success:
// a park of an ID already parked is one (a POST sent again after its
// answer was lost).
func (d *daemon) post(ctx context.Context, id string, delay time.Duration) error {
	body, _ := json.Marshal(map[string]any{"id": id, "delay": delay.Milliseconds(), "sink": "out", "destination": "fired.fault", "body": id})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.admin+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST /v1/messages: %d %s", resp.StatusCode, b)
	}
	return nil
}

// cancelLoop publishes, every cancelPace until ctx ends, a message due in
// cancelLead, waits until it is parked, and cancels it through the ingest
// (a control message with x-delay-cancel). A cancel is read within
// milliseconds, or, when the daemon that took it stops first, again after
// ack_wait (2 s): long before the message is due, so that every one must
// win (finish checks that none is published). The channel is closed when
// the loop ended.
func (f *fleet) cancelLoop(ctx context.Context) <-chan struct{} {
	w := f.w
	done := make(chan struct{})
	js := connectJetStream(w.t, w.in.URL, "fault canceller")
	keys := store.NewKeys(keyPrefix)
	go func() {
		defer close(done)
		tick := time.NewTicker(cancelPace)
		defer tick.Stop()
		// ctx stops the loop between messages; a message begun is published
		// and cancelled whole (under the world's ctx): a publish cut off by
		// the stop may still have reached the broker, and it would then be
		// delivered as a message nobody sent.
		for k := cancelBase; ctx.Err() == nil; k++ {
			id := w.pub.id(k)
			w.pub.publish(w.ctx, k, time.Now().Add(cancelLead))
			if !await(cancelLead/2, func() bool {
				ok, err := w.rdb.HExists(context.Background(), keys.Pool(shardOf(id)), id).Result()
				return err == nil && ok
			}) {
				w.t.Errorf("%s was not parked within %v: not cancelled", id, cancelLead/2)
				continue
			}
			m := nats.NewMsg("delayed.fault")
			m.Header.Set(envelope.HeaderCancel, id)
			m.Header.Set(envelope.HeaderMessageID, "cancel-"+id)
			m.Header.Set(envelope.HeaderNatsMsgID, "cancel-"+id)
			var ack *jetstream.PubAck
			for w.ctx.Err() == nil {
				pctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
				a, err := js.PublishMsg(pctx, m)
				cancel()
				if err == nil {
					ack = a
					break
				}
			}
			if ack == nil {
				return
			}
			w.pub.cancel(id, time.Now())
			f.mu.Lock()
			f.cancels++
			f.cancelSeqFloor = max(f.cancelSeqFloor, ack.Sequence)
			f.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	return done
}

// checkCancels fails when a cancelled message reached the sink at all
// (finish checks the copies after the cancel; this, any).
func (f *fleet) checkCancels() {
	copies := f.w.col.snapshot()
	published := 0
	for id := range f.w.pub.cancelledAt() {
		if len(copies[id]) > 0 {
			published++
		}
	}
	if published > 0 {
		f.w.t.Errorf("%d of %d messages cancelled through the ingest %v before their due time were published", published, f.cancels, cancelLead)
	}
}

// layout is the layout the store records in <prefix>:config ("" none).
func (w *world) layout() string {
	v, _ := w.rdb.HGet(context.Background(), store.NewKeys(keyPrefix).Config(), "layout").Result()
	return v
}

// deadReasons is the dead messages' reasons as the store records them (the
// meta value's last field), counted.
func (w *world) deadReasons() map[string]int {
	ctx := context.Background()
	keys := store.NewKeys(keyPrefix)
	out := map[string]int{}
	for sh := 0; sh < shards; sh++ {
		ids, _ := w.rdb.ZRange(ctx, keys.Dead(sh), 0, -1).Result()
		for _, id := range ids {
			meta, _ := w.rdb.HGet(ctx, keys.Meta(sh), id).Result()
			reason := meta
			if f := strings.SplitN(meta, "|", 4); len(f) == 4 {
				reason = f[3]
			}
			out[reason]++
		}
	}
	return out
}

func grepLines(s, substr string, n int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && len(out) < n {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestRollingUpgrade upgrades two daemons of the previous release to this
// build as a Kubernetes rolling update does, while publishers keep
// publishing: the new build's daemons start one by one beside the old
// ones, all four run side by side on one Redis and one JetStream durable
// consumer, then the old ones are stopped (SIGTERM) one by one, each while
// it claims a burst; publishing goes on a while after. Traffic: the stream
// (delays 0-5 s), every tenth message POSTed to the admin API of a daemon
// of either build, and messages cancelled through the ingest. At the end
// the ingest reads again everything from before the first stop (reread):
// the new build must know the deliveries of both builds.
//
// Guarantee: nothing lost, nothing early, nothing dead, no cancelled
// message published, duplicates no more than what was in flight at the
// stops and the re-read, none of a re-read whose delivery either build
// marked, and no claim left to its lease by a graceful stop. What the
// previous release's stops leave to the ingest's ack_wait is reported
// (stranded): no build started later can change how an old one stops.
func TestRollingUpgrade(t *testing.T) {
	w := newWorld(t, "rolling-upgrade", options{ackWait: upgradeAckWait})
	w.res.Fault = fmt.Sprintf("two daemons of the previous release (%s) upgraded to this build one by one, as a rolling update does: new ones started beside the old, all four side by side, then the old ones SIGTERMed one by one while claiming a burst; publishing throughout (stream, POSTs to both builds, cancels through the ingest); then the ingest re-reads from before the stops", previousRelease)
	prev, cur := previousBuild(t), testenv.Build(t)
	n := scaled(rate * upgradeSeconds)
	span := time.Duration(n) * time.Second / rate // the stream's length
	f := newFleet(w, n)
	old1 := f.start(prev, buildPrevious, "old-1")
	old2 := f.start(prev, buildPrevious, "old-2")
	began := time.Now()
	done := w.pub.stream(w.ctx, 0, n, rate)
	cctx, stopCancels := context.WithCancel(w.ctx)
	defer stopCancels()
	cancelsDone := f.cancelLoop(cctx)
	phase := func(frac float64, what string) {
		w.holdUntil(began.Add(time.Duration(frac*float64(span))), what)
	}

	phase(0.15, "the previous release alone (scenario parameter)")
	f.start(cur, buildNew, "new-1")
	if l := w.layout(); l != "1" {
		t.Errorf("the new build records layout %q in %s, want 1", l, store.NewKeys(keyPrefix).Config())
	}
	phase(0.30, "one new daemon beside the two old ones (scenario parameter)")
	f.start(cur, buildNew, "new-2")
	phase(0.50, "two builds side by side (scenario parameter)")
	// The cancels end here: the re-read below starts after them (a re-read
	// of a cancelled message parks it again whatever the build: a cancel is
	// no delivery and leaves no mark).
	stopCancels()
	<-cancelsDone
	phase(0.55, "two builds side by side (scenario parameter)")
	f.stop(old1, n)
	phase(0.72, "one old daemon left (scenario parameter)")
	last := f.stop(old2, n+burstSize)
	// The upgrade's last step, once no daemon of the previous release
	// runs: the store to layout 2 while the new build's daemons run and
	// publishing goes on.
	newest := f.migrate("up")
	if l := w.layout(); l != "2" {
		t.Errorf("after migrate up %s records layout %q, want 2", store.NewKeys(keyPrefix).Config(), l)
	}
	w.waitPublished(done)
	// What the stops left to the ingest's ack_wait comes back first, so
	// that the re-read does not hide it.
	w.holdUntil(last.exit.Add(upgradeAckWait+time.Second), "the ingest's ack_wait after the last stop (scenario parameter)")
	rr := w.rereadFrom(f.cancelSeqFloor + 1)
	w.settle(settleFor)

	copies := w.col.snapshot()
	doneDups, doneIDs := rr.duplicates(copies, "done")
	seenDups, seenIDs := rr.duplicates(copies, "seen")
	unmarkedDups, _ := rr.duplicates(copies, "")
	w.res.DupBound = f.bound() + rr.inflight
	f.checkStops()
	f.checkCancels()
	// The previous release drops what its pull fetched and did not read
	// when it stops (this build gives it back: natsbroker's Close): those
	// messages come back after the ingest's ack_wait. Reported, since no
	// build started later can change how an old one stops.
	stranded := w.stranded(upgradeAckWait)
	w.logStranded(stranded)
	f.mu.Lock()
	w.res.note("%d POSTed to the previous release's daemons and %d to the new build's, the others through the ingest; %d cancelled through the ingest (due %v later) and none published; layout recorded by the new build: 1, then migrate up under traffic: %s",
		f.posted[buildPrevious], f.posted[buildNew], f.cancels, cancelLead, newest)
	f.mu.Unlock()
	w.res.note("%d messages left by the previous release's stops to the ingest's ack_wait (%v here, 30 s by default) and delivered that late: it drops its pull's read-ahead at a stop", len(stranded), upgradeAckWait)
	w.res.note("re-read after the upgrade: %d ingest messages (stream sequences %d-%d), %d of them delivered and marked by the previous release (done keys) and %d by the new build (seen buckets): parked again %d and %d (duplicates %d and %d), %d duplicates among the unmarked (%d claims in flight at the reset); dup bound = in flight at the stops and the reset",
		len(rr.ids), rr.from, rr.to, rr.count("done"), rr.count("seen"), doneIDs, seenIDs, doneDups, seenDups, unmarkedDups, rr.inflight)
	if doneDups+seenDups > 0 {
		t.Errorf("the new build parked again %d re-reads of messages delivered by the previous release and %d of its own, within the dedupe window", doneIDs, seenIDs)
	}
	if rr.count("done") == 0 || rr.count("seen") == 0 {
		t.Errorf("the re-read covers %d deliveries of the previous release and %d of the new build: it tests nothing of one of them", rr.count("done"), rr.count("seen"))
	}
	if reasons := w.deadReasons(); len(reasons) > 0 {
		t.Errorf("dead messages after the upgrade, by reason: %v", reasons)
	}
	w.finish(false)
}

// TestRollback rolls this build back to the previous release as
// docs/operations.md says: the new build's daemons, taking traffic, are
// stopped (SIGTERM), each while it claims a burst, `delaybridge migrate
// down` writes what the previous release reads, and two daemons of the
// previous release start on the same Redis and consumer; publishing goes
// on throughout. Then the ingest reads again everything from before the
// stops (reread), as a crash or a lost ack makes it read again.
//
// Guarantee: nothing lost, nothing early, nothing dead (the previous
// release decodes every record of the new build), no cancelled message
// published, no claim left to its lease and nothing to the ingest's
// ack_wait by the new build's stops, duplicates no more than what was in
// flight at the stops and the re-read, none of a re-read whose delivery
// either build marked (migrate down copied the new build's marks).
func TestRollback(t *testing.T) {
	w := newWorld(t, "rollback", options{ackWait: upgradeAckWait})
	w.res.Fault = fmt.Sprintf("two daemons of this build SIGTERMed one by one while claiming a burst, then two of the previous release (%s) started on the same Redis; publishing throughout (stream, POSTs to both builds, cancels through the ingest); then the ingest re-reads from before the stops", previousRelease)
	prev, cur := previousBuild(t), testenv.Build(t)
	n := scaled(rate * upgradeSeconds * 2 / 3)
	span := time.Duration(n) * time.Second / rate
	f := newFleet(w, n)
	new1 := f.start(cur, buildNew, "new-1")
	new2 := f.start(cur, buildNew, "new-2")
	began := time.Now()
	done := w.pub.stream(w.ctx, 0, n, rate)
	cctx, stopCancels := context.WithCancel(w.ctx)
	defer stopCancels()
	cancelsDone := f.cancelLoop(cctx)
	// The new build in the newest layout, converted while it runs under
	// traffic, so that the rollback below starts from it.
	w.holdUntil(began.Add(span*10/100), "the new build alone (scenario parameter)")
	upped := f.migrate("up")
	if l := w.layout(); l != "2" {
		t.Errorf("after migrate up %s records layout %q, want 2", store.NewKeys(keyPrefix).Config(), l)
	}

	w.holdUntil(began.Add(span*30/100), "the new build alone (scenario parameter)")
	stopCancels() // the re-read starts after them, as in TestRollingUpgrade
	<-cancelsDone
	w.holdUntil(began.Add(span*35/100), "the new build alone (scenario parameter)")
	f.stop(new1, n)
	last := f.stop(new2, n+burstSize)
	downed := f.migrate("down")
	f.start(prev, buildPrevious, "old-1")
	f.start(prev, buildPrevious, "old-2")
	gap := time.Since(last.exit)
	w.logf("the previous release runs %v after the last stop of the new build", gap.Round(time.Millisecond))
	w.waitPublished(done)
	w.holdUntil(last.exit.Add(upgradeAckWait+time.Second), "the ingest's ack_wait after the last stop (scenario parameter)")
	rr := w.rereadFrom(f.cancelSeqFloor + 1)
	w.settle(settleFor)

	copies := w.col.snapshot()
	doneDups, doneIDs := rr.duplicates(copies, "done")
	seenDups, seenIDs := rr.duplicates(copies, "seen")
	unmarkedDups, _ := rr.duplicates(copies, "")
	w.res.DupBound = f.bound() + rr.inflight
	f.checkStops()
	f.checkCancels()
	if stranded := w.stranded(upgradeAckWait); len(stranded) > 0 {
		w.logStranded(stranded)
		t.Errorf("%d messages were delivered by the ingest again after its ack_wait %v: a stop of the new build left what its pull fetched to the ack wait instead of giving it back: %v",
			len(stranded), upgradeAckWait, first(stranded, 10))
	}
	f.mu.Lock()
	w.res.note("%d POSTed to the new build's daemons and %d to the previous release's, %d cancelled through the ingest and none published; the previous release ran %s after the last stop; layout left in Redis: %q (the previous release ignores it); migrate up under traffic: %s; migrate down: %s",
		f.posted[buildNew], f.posted[buildPrevious], f.cancels, dur(gap), w.layout(), upped, downed)
	f.mu.Unlock()
	w.res.note("re-read after the rollback: %d ingest messages (stream sequences %d-%d), %d of them delivered and marked by the new build (seen buckets, copied by migrate down) and %d by the previous release (done keys): the previous release parked again %d and %d (duplicates %d and %d), %d duplicates among the unmarked (%d claims in flight at the reset); dup bound = in flight at the stops and the reset",
		len(rr.ids), rr.from, rr.to, rr.count("seen"), rr.count("done"), seenIDs, doneIDs, seenDups, doneDups, unmarkedDups, rr.inflight)
	if doneDups+seenDups > 0 {
		t.Errorf("the previous release parked again %d re-reads of messages it delivered itself and %d of the new build's, within the dedupe window", doneIDs, seenIDs)
	}
	if rr.count("seen") == 0 || rr.count("done") == 0 {
		t.Errorf("the re-read covers %d deliveries of the new build and %d of the previous release: it tests nothing of one of them", rr.count("seen"), rr.count("done"))
	}
	if reasons := w.deadReasons(); len(reasons) > 0 {
		t.Errorf("dead messages after the rollback, by reason: %v", reasons)
	}
	w.finish(false)
}

// upgradeAckWait is the ingest's ack_wait in the upgrade scenarios: a
// message a stopping daemon took from the ingest and neither parked nor
// gave back is delivered again only after it, at least ten seconds after
// it was due (delays are at most 5 s), which no load on the machine
// passes for: stranded tells those apart.
const upgradeAckWait = 15 * time.Second

// stranded is the messages whose first copy came ack_wait (less a second)
// or more after the ingest confirmed them: the ingest delivered them again
// after ack_wait because the daemon that had taken them stopped without
// parking them or giving them back. Everything else is delivered at most
// its delay (5 s) and its lateness after the confirmation.
func (w *world) stranded(ackWait time.Duration) []string {
	sentMap, order, _ := w.pub.snapshot()
	copies := w.col.snapshot()
	var ids []string
	for _, id := range order {
		cs := copies[id]
		if len(cs) > 0 && cs[0].at.Sub(sentMap[id].at) >= ackWait-time.Second {
			ids = append(ids, id)
		}
	}
	return ids
}

// logStranded logs what stranded found, with the times that tell.
func (w *world) logStranded(ids []string) {
	sentMap, _, _ := w.pub.snapshot()
	copies := w.col.snapshot()
	for _, id := range first(ids, 20) {
		w.logf("delivered after the ingest's ack_wait: %s confirmed by the ingest at %s, due %s, first copy %s",
			id, sentMap[id].at.Format("15:04:05.000"), copies[id][0].due.Format("15:04:05.000"), copies[id][0].at.Format("15:04:05.000"))
	}
}

// reread is a re-read of the ingest injected by a scenario: its durable
// consumer reset to an earlier stream sequence ($JS.API.CONSUMER.RESET, an
// operator's rewind; a crash or a lost ack makes the same re-reads), so
// that the daemons read again every message from there on. Within
// scheduler.dedupe_window a re-read of a delivered message is a duplicate
// that is not parked again when the build that reads it finds the mark of
// its delivery: the previous release writes <prefix>:{N}:done:... keys,
// this build fields of <prefix>:{N}:seen:<bucket> hashes (and reads both).
type reread struct {
	from, to uint64            // the stream sequences read again
	marked   map[string]string // re-read ID -> "done" or "seen": the mark of its delivery in Redis at the reset
	ids      []string          // every message read again
	inflight int               // claims in Redis at the reset
}

// rereadFrom resets the ingest's consumer to stream sequence from, after
// noting which of the messages from there on Redis holds a mark of
// delivery for, and of which kind.
func (w *world) rereadFrom(from uint64) *reread {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := connectJetStream(w.t, w.in.URL, "fault rewinder")
	stream, err := js.Stream(ctx, "DELAYED")
	if err != nil {
		w.t.Fatalf("re-read: %v", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		w.t.Fatalf("re-read: %v", err)
	}
	rr := &reread{from: from, to: info.State.LastSeq, marked: map[string]string{}}
	for seq := from; seq <= rr.to; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			w.t.Fatalf("re-read: sequence %d: %v", seq, err)
		}
		if id := m.Header.Get(envelope.HeaderCancel); id != "" {
			w.t.Fatalf("re-read: sequence %d is a cancel (of %s): a re-read must start after the cancels, or it parks what they cancelled again", seq, id)
		}
		rr.ids = append(rr.ids, m.Header.Get(envelope.HeaderMessageID))
	}
	keys := store.NewKeys(keyPrefix)
	buckets := map[int][]string{} // shard -> its seen buckets
	for sh := 0; sh < shards; sh++ {
		b, err := w.rdb.Keys(ctx, fmt.Sprintf("%s:{%d}:seen:*", keyPrefix, sh)).Result()
		if err != nil {
			w.t.Fatalf("re-read: %v", err)
		}
		buckets[sh] = b
	}
	// A seen field is the new build's delivery (migrate down copies it
	// into a done key too); a done key alone, the previous release's.
	for _, id := range rr.ids {
		for _, b := range buckets[shardOf(id)] {
			if ok, _ := w.rdb.HExists(ctx, b, store.SeenField(id, "DELAYED")).Result(); ok {
				rr.marked[id] = "seen"
				break
			}
		}
		if rr.marked[id] != "" {
			continue
		}
		if n, _ := w.rdb.Exists(ctx, keys.Done(shardOf(id), id, "DELAYED")).Result(); n > 0 {
			rr.marked[id] = "done"
		}
	}
	rr.inflight = w.redisState().inflight
	var resp struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
		ResetSeq uint64 `json:"reset_seq"`
	}
	nc, err := nats.Connect(w.in.URL, nats.Name("fault rewinder"))
	if err != nil {
		w.t.Fatalf("re-read: %v", err)
	}
	defer nc.Close()
	msg, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.RESET.DELAYED.delaybridge", fmt.Appendf(nil, `{"seq":%d}`, from))
	if err != nil {
		w.t.Fatalf("re-read: reset the consumer: %v", err)
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Error != nil || resp.ResetSeq != from {
		w.t.Fatalf("re-read: reset the consumer to %d: %s (%v)", from, msg.Data, err)
	}
	w.logf("the ingest's consumer reset to stream sequence %d: %d messages read again (to %d), %d of them with a mark of their delivery in Redis (%d done keys, %d seen fields), %d claims in flight",
		from, len(rr.ids), rr.to, len(rr.marked), rr.count("done"), rr.count("seen"), rr.inflight)
	return rr
}

func (rr *reread) count(kind string) int {
	n := 0
	for _, k := range rr.marked {
		if k == kind {
			n++
		}
	}
	return n
}

// duplicates counts the copies beyond the first of the re-read messages
// with a mark of the kind given ("" none).
func (rr *reread) duplicates(copies map[string][]copyAt, kind string) (dups, ids int) {
	for _, id := range rr.ids {
		if rr.marked[id] != kind {
			continue
		}
		if n := len(copies[id]); n > 1 {
			dups += n - 1
			ids++
		}
	}
	return dups, ids
}

// TestPreviousReleaseRefusesLayout2: the previous release reads no layout,
// but compares the recorded shard count with its own before it touches
// anything; in layout 2 that record says which layout and what to run
// (store.shardsRecord), so the previous release, started on such a store,
// exits 1 saying so instead of running on it, where it missed every held
// message and counted half of what was parked. A store put in layout 2 by
// a build before the record said so gets it from migrate up. After migrate
// down it starts.
func TestPreviousReleaseRefusesLayout2(t *testing.T) {
	rs, ns := testenv.Redis(t), testenv.NATS(t)
	ctx := context.Background()
	rdb := rs.Client()
	prev := previousBuild(t)
	cfg := fmt.Sprintf(`
redis: {addr: %q, key_prefix: l2, shards: 4}
admin: {listen: "127.0.0.1:%d"}
sinks: [{name: out, nats: {url: %q}}]
`, rs.Addr, testenv.FreePort(t), ns.URL)
	path := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	s := store.New(rdb, store.Options{Prefix: "l2", Shards: 4})
	if _, err := s.CheckLayout(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckShards(ctx); err != nil { // the first start of this build
		t.Fatal(err)
	}
	refused := func(what string) {
		t.Helper()
		old := testenv.StartProcess(t, prev, "run", "--config", path)
		if code := old.Wait(60 * time.Second); code != 1 {
			t.Fatalf("the previous release on %s: exit %d, want 1; output:\n%s", what, code, old.Output())
		}
		if out := old.Output(); !strings.Contains(out, "store layout 2") || !strings.Contains(out, "migrate down") {
			t.Fatalf("the previous release on %s does not say why, and what to do:\n%s", what, out)
		}
	}
	refused("a new store in layout 2")
	// As a build of layout 2 before the record's form recorded it.
	if err := rdb.HSet(ctx, s.Keys().Config(), "shards", "4").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MigrateUp(ctx); err != nil {
		t.Fatal(err)
	}
	refused("a store in layout 2 after migrate up")
	if _, err := s.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}
	if v := rdb.HGet(ctx, s.Keys().Config(), "shards").Val(); v != "4" {
		t.Fatalf("after migrate down the shard count is recorded as %q, want 4, as the previous release reads it", v)
	}
	old := testenv.StartProcess(t, prev, "run", "--config", path)
	if old.Exited() {
		t.Fatalf("the previous release exited after migrate down:\n%s", old.Output())
	}
	if !testenv.Poll(30*time.Second, func() bool { return strings.Contains(old.Output(), "delaybridge running") }) {
		t.Fatalf("the previous release does not run after migrate down:\n%s", old.Output())
	}
	old.Signal(syscall.SIGTERM)
	if code := old.Wait(30 * time.Second); code != 0 {
		t.Fatalf("the previous release: exit %d after SIGTERM\n%s", code, old.Output())
	}
}
