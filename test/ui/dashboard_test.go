// Package ui tests the admin dashboard (pkg/admin/ui) the way an operator
// uses it: Debian's headless chromium, driven by chromedp, on the page of the
// real delaybridge binary, which runs against real Redis and NATS servers
// started by the test.
package ui

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const (
	adminToken = "dash-5f2c9e-token"
	chromium   = "/usr/bin/chromium"
)

// The route's own destination, held.orders, is stored by no stream: a
// publish to it fails and is retried after the back-off of 10 minutes. Valid
// messages choose fired.orders with x-delay-destination; rejected messages
// keep the route's destination, so a dead message that is retried stays
// scheduled (after one failed attempt) where the test can see it.
const daemonConfig = `
redis: {addr: "%s", key_prefix: ui}
admin: {listen: "%s"%s}
log: {level: %s}
scheduler: {max_sleep: 250ms, backoff: {initial: 10m, max: 10m}}
ingest:
  - name: orders
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    route:
      sink: out
      destination: held.orders
      allow_override: true
      allowed_destinations: ["fired.*"]
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`

// env is Redis, NATS with an ingest stream DELAYED (delayed.>) and a sink
// stream FIRED (fired.>), and the daemon between them.
type env struct {
	t     *testing.T
	js    jetstream.JetStream
	admin string // http://host:port
	proc  *testenv.Process
	redis *testenv.RedisServer
}

// newEnv starts the daemon with admin.token adminToken.
func newEnv(t *testing.T) *env { return newEnvToken(t, adminToken, "info") }

// newEnvToken starts the daemon with admin.token token ("": none) and
// log.level level (debug logs every admin request with its status), on a
// Redis started with the options.
func newEnvToken(t *testing.T, token, level string, redisOpts ...testenv.RedisOption) *env {
	t.Helper()
	rs, ns := testenv.Redis(t, redisOpts...), testenv.NATS(t)
	_, js := ns.Client(t)
	for name, subject := range map[string]string{"DELAYED": "delayed.>", "FIRED": "fired.>"} {
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
			t.Fatal(err)
		}
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	tokenYAML := ""
	if token != "" {
		tokenYAML = fmt.Sprintf(", token: %q", token)
	}
	if err := os.WriteFile(cfg, fmt.Appendf(nil, daemonConfig, rs.Addr, addr, tokenYAML, level, ns.URL, ns.URL), 0o644); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, js: js, admin: "http://" + addr, redis: rs}
	e.proc = testenv.StartProcess(t, testenv.Build(t), "run", "--config", cfg)
	testenv.Eventually(t, 60*time.Second, func() bool {
		if e.proc.Exited() {
			t.Fatalf("delaybridge exited at start:\n%s", e.proc.Output())
		}
		code, _ := e.do(http.MethodGet, "/readyz", nil)
		return code == http.StatusOK
	}, "delaybridge not ready")
	return e
}

// publish sends one message to the ingest stream; headers are name, value
// pairs.
func (e *env) publish(id string, headers ...string) error {
	m := nats.NewMsg("delayed.orders")
	m.Data = []byte(`{"order":"` + id + `"}`)
	m.Header.Set("x-message-id", id)
	for i := 0; i+1 < len(headers); i += 2 {
		m.Header.Set(headers[i], headers[i+1])
	}
	_, err := e.js.PublishMsg(context.Background(), m)
	return err
}

// delivered reports whether the sink stream FIRED holds a message of id
// on subject.
func (e *env) delivered(subject, id string) bool {
	ctx := context.Background()
	s, err := e.js.Stream(ctx, "FIRED")
	if err != nil {
		return false
	}
	info, err := s.Info(ctx)
	if err != nil {
		return false
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err == nil && m.Subject == subject && m.Header.Get("x-message-id") == id {
			return true
		}
	}
	return false
}

// park publishes a valid message due after delay.
func (e *env) park(id string, delay time.Duration) {
	e.t.Helper()
	if err := e.publish(id, "x-delay", strconv.FormatInt(delay.Milliseconds(), 10), "x-delay-destination", "fired.orders"); err != nil {
		e.t.Fatal(err)
	}
}

// do calls the admin API with the token and decodes a 2xx JSON answer into v.
func (e *env) do(method, path string, v any) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.admin+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(body, v); err != nil {
			e.t.Fatalf("%s %s: %v in %s", method, path, err, body)
		}
	}
	return resp.StatusCode, string(body)
}

// stats is GET /v1/stats, as numbers formatted the way the page shows them.
type stats struct {
	Parked int64            `json:"parked"`
	Due    int64            `json:"due"`
	Dead   int64            `json:"dead"`
	DueIn  map[string]int64 `json:"due_in"`
	Shards []struct {
		Shard  int   `json:"shard"`
		Parked int64 `json:"parked"`
	} `json:"shards"`
}

func (e *env) stats() stats {
	e.t.Helper()
	var s stats
	if code, body := e.do(http.MethodGet, "/v1/stats", &s); code != http.StatusOK {
		e.t.Fatalf("GET /v1/stats: %d %s", code, body)
	}
	return s
}

// shown is what the page shows of the stats: the texts of its elements.
type shown struct {
	Parked string            `json:"parked"`
	Due    string            `json:"due"`
	Dead   string            `json:"dead"`
	DueIn  map[string]string `json:"due_in"`
	Shards [][2]string       `json:"shards"` // [shard number, parked]
}

const readShown = `(() => {
  const text = (id) => document.getElementById(id).textContent;
  const dueIn = {};
  for (const k of ['overdue', 'minute', 'hour', 'day', 'later']) dueIn[k] = text('due-' + k);
  return {
    parked: text('stat-parked'), due: text('stat-due'), dead: text('stat-dead'), due_in: dueIn,
    shards: [...document.querySelectorAll('#shards .shard')].map((c) => [c.dataset.shard, c.querySelector('.shard-parked').textContent]),
  };
})()`

// diff compares what the page shows with the API's stats; "" when equal.
func (s stats) diff(p shown) string {
	num := func(n int64) string { return strconv.FormatInt(n, 10) }
	plain := func(s string) string { return strings.ReplaceAll(s, ",", "") } // the page groups thousands
	var d []string
	check := func(what, got string, want int64) {
		if plain(got) != num(want) {
			d = append(d, fmt.Sprintf("%s: page %q, API %d", what, got, want))
		}
	}
	check("parked", p.Parked, s.Parked)
	check("due", p.Due, s.Due)
	check("dead", p.Dead, s.Dead)
	for _, k := range []string{"overdue", "minute", "hour", "day", "later"} {
		check("due_in."+k, p.DueIn[k], s.DueIn[k])
	}
	if len(p.Shards) != len(s.Shards) {
		return fmt.Sprintf("page shows %d shards, API has %d", len(p.Shards), len(s.Shards))
	}
	for i, sh := range s.Shards {
		if p.Shards[i][0] != strconv.Itoa(sh.Shard) {
			d = append(d, fmt.Sprintf("shard %d: the page's cell %d is shard %q", sh.Shard, i, p.Shards[i][0]))
		}
		check(fmt.Sprintf("shard %d parked", sh.Shard), p.Shards[i][1], sh.Parked)
	}
	return strings.Join(d, "; ")
}

// TestDashboard runs the dashboard in a browser against the daemon: the token
// form, the numbers against GET /v1/stats, the dead messages (shown as text,
// retried, deleted), the lookup with cancel, and the charts under load, of
// which it saves a screenshot as docs/dashboard.png.
func TestDashboard(t *testing.T) {
	start := time.Now()
	phase := func(name string) {
		t.Logf("%6.1fs %s", time.Since(start).Seconds(), name)
	}
	e := newEnv(t)
	phase("daemon ready")

	// Parked messages: due in about a minute, in the next hour, the next
	// day, and later; none due in seconds yet, so the numbers hold still.
	var parked int64
	for i := range 4 {
		e.park(fmt.Sprintf("minute-%d", i), 50*time.Second)
		parked++
	}
	for i := range 12 {
		e.park(fmt.Sprintf("hour-%02d", i), time.Duration(5+rand.IntN(50))*time.Minute)
		parked++
	}
	for i := range 40 {
		e.park(fmt.Sprintf("day-%02d", i), time.Duration(60+rand.IntN(22*60))*time.Minute)
		parked++
	}
	for i := range 6 {
		e.park(fmt.Sprintf("later-%d", i), time.Duration(48+rand.IntN(100))*time.Hour)
		parked++
	}
	// Dead messages: invalid ones, kept with their reasons. One has HTML in
	// its ID and its reason, which the page must show as text.
	const htmlID = `<b id="injected">bold</b>&amp;"q"`
	dead := map[string][]string{
		"dead-soon":     {"x-delay", "soon"},
		"dead-negative": {"x-delay", "-5s"},
		"dead-both":     {"x-delay", "1s", "x-deliver-at", "2030-01-01T00:00:00Z"},
		"dead-delete":   {"x-deliver-at", "tomorrow"},
		// A destination the route does not allow (fired.*): retried only
		// with one given.
		"dead-lane": {"x-delay", "1s", "x-delay-destination", "elsewhere.orders"},
		htmlID:      {"x-deliver-at", `<img id="injected" src="x">`},
	}
	for id, headers := range dead {
		if err := e.publish(id, headers...); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		s := e.stats()
		return s.Parked == parked && s.Dead == int64(len(dead))
	}, "messages not parked and dead")
	phase(fmt.Sprintf("%d parked, %d dead", parked, len(dead)))

	// The daemon samples its counters every 2 s from its start: the page
	// shows them when it opens, not only what it polls itself.
	testenv.Eventually(t, 30*time.Second, func() bool {
		var h struct {
			Samples []struct{ At string } `json:"samples"`
		}
		code, _ := e.do(http.MethodGet, "/v1/history", &h)
		return code == http.StatusOK && len(h.Samples) >= 5
	}, "the daemon kept no history")
	opened := time.Now()

	ctx, exceptions := startBrowser(t)
	phase("browser started")

	// The page asks for the token: a wrong one is refused, the right one is
	// kept in sessionStorage only.
	run(t, "open the page", ctx,
		chromedp.Navigate(e.admin+"/"),
		chromedp.WaitVisible(chromedp.ID("token-dialog")),
		chromedp.SendKeys(chromedp.ID("token-input"), "wrong-token"),
		chromedp.Click(chromedp.CSS("#token-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.ID("token-error")),
	)
	if msg := value[string](t, ctx, `document.getElementById('token-error').textContent`); !strings.Contains(msg, "rejected") {
		t.Errorf("a wrong token shows %q, want it called rejected", msg)
	}
	run(t, "enter the token", ctx,
		chromedp.SendKeys(chromedp.ID("token-input"), adminToken),
		chromedp.Click(chromedp.CSS("#token-form button[type=submit]")),
		chromedp.WaitNotVisible(chromedp.ID("token-dialog")),
	)
	if got := value[string](t, ctx, `sessionStorage.getItem('delaybridge.adminToken')`); got != adminToken {
		t.Errorf("sessionStorage holds %q, want the token", got)
	}
	if where := value[string](t, ctx, `location.href + ' ' + document.cookie`); strings.Contains(where, adminToken) {
		t.Errorf("the token is in the URL or a cookie: %s", where)
	}
	phase("token accepted")

	// The charts start with the daemon's history: points from before the
	// page opened.
	poll(t, ctx, "charts from the history", `+document.getElementById('chart-rates').dataset.points >= 4`,
		chromedp.WithPollingTimeout(10*time.Second))
	if from, err := time.Parse(time.RFC3339Nano, value[string](t, ctx, `document.getElementById('chart-rates').dataset.from`)); err != nil ||
		!from.Before(opened.Add(-4*time.Second)) {
		t.Errorf("the charts start at %v (%v), want the daemon's samples from before the page opened at %v", from, err, opened)
	}
	phase("history shown")

	// The numbers match the API's. Both sides move when the minute messages
	// come due, so compare until one poll of the page agrees.
	var lastDiff string
	testenv.Eventually(t, 30*time.Second, func() bool {
		p := value[shown](t, ctx, readShown)
		lastDiff = e.stats().diff(p)
		return lastDiff == ""
	}, "the page's numbers differ from GET /v1/stats: %s", lazy(func() string { return lastDiff }))
	phase("numbers match /v1/stats")

	// Dead messages: every one listed with its reason, as text.
	type deadRow struct{ ID, Shown, Reason string }
	rowsJS := `[...document.querySelectorAll('#dead-rows tr')].map((tr) => ({
	  ID: tr.dataset.id, Shown: tr.querySelector('td.id').textContent, Reason: tr.querySelector('td.reason').textContent}))`
	poll(t, ctx, "dead list shown", fmt.Sprintf(`document.querySelectorAll('#dead-rows tr').length === %d`, len(dead)))
	var apiDead []struct{ ID, Reason string }
	if code, body := e.do(http.MethodGet, "/v1/dead", &apiDead); code != http.StatusOK {
		t.Fatalf("GET /v1/dead: %d %s", code, body)
	}
	reasons := map[string]string{}
	for _, d := range apiDead {
		reasons[d.ID] = d.Reason
	}
	for _, r := range value[[]deadRow](t, ctx, rowsJS) {
		if r.Shown != r.ID || reasons[r.ID] == "" || r.Reason != reasons[r.ID] {
			t.Errorf("dead row %q shows ID %q reason %q; the API says reason %q", r.ID, r.Shown, r.Reason, reasons[r.ID])
		}
	}
	if !strings.Contains(reasons[htmlID], "<img") {
		t.Errorf("the reason of %q does not quote the header: %q", htmlID, reasons[htmlID])
	}
	if n := value[int](t, ctx, `document.querySelectorAll('#injected, #dead-rows b, #dead-rows img').length`); n != 0 {
		t.Errorf("data became markup: %d injected elements on the page", n)
	}
	phase("dead messages listed as text")

	// Retry: the message is scheduled again, on the page and in the API.
	// The clicks find and click a button in one step: the list may be drawn
	// again between a lookup of a node and a click on it.
	clickNow(t, ctx, "retry dead-soon", `#dead-rows tr[data-id="dead-soon"] button.retry`)
	poll(t, ctx, "retried message shown as scheduled",
		`document.getElementById('lookup-title').textContent === 'dead-soon' &&
		 document.getElementById('lookup-state').textContent === 'scheduled' &&
		 document.getElementById('lookup-json').textContent.includes('"state": "scheduled"')`)
	testenv.Eventually(t, 10*time.Second, func() bool {
		var m struct{ State string }
		code, _ := e.do(http.MethodGet, "/v1/messages/dead-soon", &m)
		return code == http.StatusOK && m.State == "scheduled"
	}, "the retried message is not scheduled in the API")
	if code, _ := e.do(http.MethodGet, "/v1/dead/dead-soon", nil); code != http.StatusNotFound {
		t.Errorf("GET /v1/dead/dead-soon after retry: %d, want 404", code)
	}
	poll(t, ctx, "dead count and list updated", fmt.Sprintf(
		`document.getElementById('stat-dead').textContent === '%d' && document.querySelectorAll('#dead-rows tr').length === %d &&
		 !document.querySelector('#dead-rows tr[data-id="dead-soon"]')`, len(dead)-1, len(dead)-1))
	phase("dead message retried")

	// One that died for its destination: the retry is refused (409) and
	// asks for one; given fired.orders, it is scheduled and delivered.
	clickNow(t, ctx, "retry dead-lane", `#dead-rows tr[data-id="dead-lane"] button.retry`)
	poll(t, ctx, "retry refused, destination asked for", `!document.querySelector('#dead-rows tr[data-id="dead-lane"] form.retry-to').hidden &&
		document.getElementById('toast').textContent.includes('route.allowed_destinations')`)
	lane := `#dead-rows tr[data-id="dead-lane"]`
	run(t, "type fired.orders", ctx, chromedp.SendKeys(chromedp.CSS(lane+` input.retry-destination`), "fired.orders"))
	// Another message dies meanwhile: the list is drawn again, and the open
	// form keeps what was typed in it.
	if err := e.publish("dead-meanwhile", "x-delay", "later"); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the list drawn with the new dead message", `!!document.querySelector('#dead-rows tr[data-id="dead-meanwhile"]')`)
	if got := value[string](t, ctx, fmt.Sprintf(`(() => { const f = document.querySelector('%s form.retry-to');
		return f.hidden ? 'hidden' : f.querySelector('input.retry-destination').value; })()`, lane)); got != "fired.orders" {
		t.Errorf("after the list was drawn again, the open retry form shows %q, want the destination typed, fired.orders", got)
	}
	clickNow(t, ctx, "retry dead-lane to fired.orders", lane+` button.retry-with`)
	testenv.Eventually(t, 15*time.Second, func() bool { return e.delivered("fired.orders", "dead-lane") },
		"dead-lane not delivered to fired.orders after its retry")
	poll(t, ctx, "dead-lane gone from the list", `!document.querySelector('#dead-rows tr[data-id="dead-lane"]')`)
	phase("dead message retried to another destination")

	// Delete asks for a second click. The clicks find and click the
	// button in one step: the list may be drawn again between a lookup of
	// a node and a click on it (not while the button is armed).
	deleteBtn := `#dead-rows tr[data-id="dead-delete"] button.delete`
	clickNow(t, ctx, "delete dead-delete", deleteBtn)
	poll(t, ctx, "delete armed", fmt.Sprintf(`!!document.querySelector('%s.armed')`, deleteBtn))
	clickNow(t, ctx, "confirm delete dead-delete", deleteBtn)
	poll(t, ctx, "deleted row gone", `!document.querySelector('#dead-rows tr[data-id="dead-delete"]')`)
	if code, _ := e.do(http.MethodGet, "/v1/dead/dead-delete", nil); code != http.StatusNotFound {
		t.Errorf("GET /v1/dead/dead-delete after delete: %d, want 404", code)
	}
	phase("dead message deleted")

	// Lookup shows the JSON of GET /v1/messages/{id}; cancel removes it.
	run(t, "look up day-07", ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('lookup-id').value = ''`), // the retry filled it
		chromedp.SendKeys(chromedp.ID("lookup-id"), "day-07"),
		chromedp.Click(chromedp.CSS("#lookup-form button[type=submit]")),
	)
	poll(t, ctx, "lookup result", `document.getElementById('lookup-title').textContent === 'day-07' &&
		document.getElementById('lookup-json').textContent !== ''`)
	var api, page map[string]any
	if code, body := e.do(http.MethodGet, "/v1/messages/day-07", &api); code != http.StatusOK {
		t.Fatalf("GET /v1/messages/day-07: %d %s", code, body)
	}
	if err := json.Unmarshal([]byte(value[string](t, ctx, `document.getElementById('lookup-json').textContent`)), &page); err != nil {
		t.Fatalf("the lookup does not show JSON: %v", err)
	}
	for _, k := range []string{"id", "state", "due_at", "sink", "destination", "attempts"} {
		if fmt.Sprint(page[k]) != fmt.Sprint(api[k]) {
			t.Errorf("lookup shows %s = %v, the API %v", k, page[k], api[k])
		}
	}
	run(t, "cancel day-07", ctx,
		chromedp.Click(chromedp.ID("lookup-cancel")),
		chromedp.WaitVisible(chromedp.CSS("#lookup-cancel.armed")),
		chromedp.Click(chromedp.ID("lookup-cancel")),
	)
	poll(t, ctx, "cancel shown", `document.getElementById('lookup-state').textContent === 'cancelled'`)
	if code, _ := e.do(http.MethodGet, "/v1/messages/day-07", nil); code != http.StatusNotFound {
		t.Errorf("GET /v1/messages/day-07 after cancel: %d, want 404", code)
	}
	phase("lookup and cancel")

	// Under load: messages due in 1-30 s are published while earlier ones
	// fire. The screenshot is taken once the charts have a few samples.
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var published atomic.Int64
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond) // pacing of the load, not synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("load-%05d", i)
			delay := time.Duration(1000+rand.IntN(29000)) * time.Millisecond
			if err := e.publish(id, "x-delay", strconv.FormatInt(delay.Milliseconds(), 10), "x-delay-destination", "fired.orders"); err != nil {
				if loadCtx.Err() == nil {
					t.Errorf("publish %s: %v", id, err)
				}
				return
			}
			published.Add(1)
		}
	})
	t.Cleanup(func() { stopLoad(); wg.Wait() }) // also when a step below fails
	// A scheduled message in the lookup, for the screenshot.
	run(t, "look up hour-03", ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('lookup-id').value = ''`),
		chromedp.SendKeys(chromedp.ID("lookup-id"), "hour-03"),
		chromedp.Click(chromedp.CSS("#lookup-form button[type=submit]")),
	)
	poll(t, ctx, "charts filled under load",
		`document.getElementById('lookup-state').textContent === 'scheduled' &&
		 +document.getElementById('chart-rates').dataset.points >= 18 &&
		 +document.getElementById('chart-lateness').dataset.points >= 8 &&
		 /^[0-9.,]+$/.test(document.getElementById('lateness-p99').textContent) &&
		 document.querySelector('#lateness-p99').parentElement.textContent.includes('Lateness p99, ms') &&
		 parseFloat(document.getElementById('rate-ingest').textContent) > 0 &&
		 parseFloat(document.getElementById('rate-fired').textContent) > 0`,
		chromedp.WithPollingTimeout(90*time.Second))
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	stopLoad()
	wg.Wait()
	phase(fmt.Sprintf("screenshot under load (%d messages published)", published.Load()))
	saveScreenshot(t, "dashboard.png", shot)

	if errs := exceptions(); len(errs) > 0 {
		t.Errorf("the page threw:\n%s", strings.Join(errs, "\n"))
	}
}

// startBrowser starts headless chromium with a fresh profile (and the extra
// options, e.g. flags) and returns a tab's context and a func that returns
// the page's uncaught exceptions so far. A chromium that cannot start fails
// the test.
func startBrowser(t *testing.T, extra ...chromedp.ExecAllocatorOption) (context.Context, func() []string) {
	t.Helper()
	bin := ensureChromium(t)
	var out syncBuffer
	opts := append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox, // the tests run as root, where chromium's sandbox refuses to start
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Env("TMPDIR=" + t.TempDir()), // where chromium leaves its singleton socket
		chromedp.WindowSize(1440, 1000),
		chromedp.CombinedOutput(&out),
	}, extra...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser; no timeout on this first call
		t.Fatalf("chromium (%s) cannot start: %v\nits output:\n%s\nInstall it with: sudo bash scripts/test-deps.sh", bin, err, out.String())
	}

	var mu sync.Mutex
	var thrown []string
	events := chromedp.Events(ctx, runtime.ExceptionThrown)
	go func() {
		for ev, err := range events {
			if err != nil {
				return
			}
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				msg += " " + d.Exception.Description
			}
			mu.Lock()
			thrown = append(thrown, fmt.Sprintf("%s (line %d)", msg, d.LineNumber+1))
			mu.Unlock()
		}
	}()
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), thrown...)
	}
}

// ensureChromium returns Debian's chromium, installing it with apt-get when
// it is missing (as scripts/test-deps.sh does); it fails the test when that
// is not possible.
func ensureChromium(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(chromium); err == nil {
		return chromium
	}
	t.Logf("%s is missing: installing Debian's chromium package", chromium)
	apt := func(args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		name := "apt-get"
		if os.Geteuid() != 0 {
			name, args = "sudo", append([]string{"-n", "apt-get"}, args...)
		}
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	err := apt("install", "-y", "-qq", "chromium")
	if err != nil { // the package lists may be missing or stale
		if err = apt("update", "-qq"); err == nil {
			err = apt("install", "-y", "-qq", "chromium")
		}
	}
	if err != nil {
		t.Fatalf("%s is missing and installing it failed: %v\nInstall it with: sudo bash scripts/test-deps.sh", chromium, err)
	}
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("apt-get installed chromium, but %s is still missing: %v", chromium, err)
	}
	return chromium
}

// run runs browser steps, failing the test with what was being done.
func run(t *testing.T, what string, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// clickNow clicks the element that the CSS selector finds, looking it up
// and clicking it in one script, as soon as there is one (30 s).
func clickNow(t *testing.T, ctx context.Context, what, selector string) {
	t.Helper()
	poll(t, ctx, what, fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true; })()`, selector))
}

// poll waits until the JavaScript expression is truthy on the page (30 s
// unless an option says otherwise).
func poll(t *testing.T, ctx context.Context, what, expr string, opts ...chromedp.PollOption) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, opts...)); err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("waiting for %s: %v\n(waited for: %s)\nthe page shows:\n%s", what, err, expr, page)
	}
}

// value evaluates a JavaScript expression on the page.
func value[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// lazy formats as the func's result at the time it is formatted.
type lazy func() string

func (l lazy) String() string { return l() }

// syncBuffer collects chromium's output for a failure message.
type syncBuffer = testenv.Output

// flagScreenshots makes the tests write their screenshots into docs/, for
// docs/guide.md (`go test ./test/ui/ -args -screenshots`); without it a test
// run leaves the tracked files alone.
var flagScreenshots = flag.Bool("screenshots", false, "write the dashboard screenshots into docs/")

// saveScreenshot writes png as docs/<name> with -screenshots, else to the
// test's temp dir, and logs where.
func saveScreenshot(t *testing.T, name string, png []byte) {
	t.Helper()
	dir := t.TempDir()
	if *flagScreenshots {
		root, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "docs")
	}
	out := filepath.Join(dir, name)
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d KiB)", out, len(png)/1024)
}
