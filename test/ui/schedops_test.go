package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// uiStore reads the daemon's Redis directly, to check that what the page
// did is what Redis holds.
func (e *env) uiStore() *store.Store {
	return store.New(e.redis.Client(), store.Options{Prefix: "ui", Shards: 16})
}

func (e *env) dueIn(id string) time.Duration {
	e.t.Helper()
	info, err := e.uiStore().Inspect(context.Background(), id)
	if err != nil {
		e.t.Fatalf("inspect %s in Redis: %v", id, err)
	}
	return time.Until(info.Message.DueAt)
}

func (e *env) gone(id string) bool {
	_, err := e.uiStore().Inspect(context.Background(), id)
	return errors.Is(err, store.ErrNotFound)
}

// TestDashboardScheduleOps clicks through the schedule operations in a
// browser against the real daemon, and checks Redis after each: the
// forecast chart against /v1/stats, a sink paused and resumed, the listing
// with its filters and pages, a message rescheduled, fired and cancelled, a
// group shown and cancelled, a recurring series ended. It saves a
// screenshot as docs/dashboard-operations.png.
func TestDashboardScheduleOps(t *testing.T) {
	e := newEnv(t)
	for i := range 12 {
		e.publishOK(fmt.Sprintf("order-%02d", i), "x-delay", fmt.Sprintf("%dm", 10+i*7), "x-delay-group", []string{"cart-7", "cart-9"}[i%2])
	}
	for i := range 30 {
		e.publishOK(fmt.Sprintf("later-%02d", i), "x-delay", fmt.Sprintf("%dh", 2+i))
	}
	e.publishOK("daily-report", "x-delay-cron", "0 6 * * *", "x-delay-timezone", "Europe/Berlin")
	e.publishOK("urgent", "x-delay", "20m", "x-delay-priority", "7")
	e.publishOK("heartbeat", "x-delay-every", "15m", "x-delay-count", "96")
	const parked = 12 + 30 + 3
	testenv.Eventually(t, 20*time.Second, func() bool { return e.stats().Parked == parked }, "messages not parked")

	ctx, exceptions := startBrowser(t)
	run(t, "open the page with the token", ctx,
		chromedp.Navigate(e.admin+"/"),
		chromedp.WaitVisible(chromedp.ID("token-dialog")),
		chromedp.SendKeys(chromedp.ID("token-input"), adminToken),
		chromedp.Click(chromedp.CSS("#token-form button[type=submit]")),
		chromedp.WaitNotVisible(chromedp.ID("token-dialog")),
	)

	// When parked messages come due: the buckets of /v1/stats (its one
	// chart of due times; "What fires when" showed the same counts again).
	var lastDiff string
	testenv.Eventually(t, 30*time.Second, func() bool {
		lastDiff = e.stats().diff(value[shown](t, ctx, readShown))
		return lastDiff == ""
	}, "the due-time buckets differ from GET /v1/stats: %s", lazy(func() string { return lastDiff }))
	if n := value[int](t, ctx, `document.querySelectorAll('#chart-forecast').length`); n != 0 {
		t.Errorf("the page still has the forecast chart (%d)", n)
	}

	// Sinks: pause, then resume; Redis agrees each time.
	poll(t, ctx, "sink listed as ready", `document.querySelector('#sinks-rows tr[data-sink="out"]')?.dataset.status === 'ready'`)
	run(t, "pause the sink", ctx, chromedp.Click(chromedp.CSS(`#sinks-rows tr[data-sink="out"] button.pause`)))
	poll(t, ctx, "sink shown paused", `document.querySelector('#sinks-rows tr[data-sink="out"]').dataset.status === 'paused' &&
		document.querySelector('#sinks-rows tr[data-sink="out"] button.pause').textContent === 'Resume'`)
	if v, err := e.redis.Client().HGet(context.Background(), "ui:sinks", "paused:out").Result(); err != nil || v != "1" {
		t.Fatalf("Redis after pause: %q %v", v, err)
	}
	run(t, "resume the sink", ctx, chromedp.Click(chromedp.CSS(`#sinks-rows tr[data-sink="out"] button.pause`)))
	poll(t, ctx, "sink shown ready", `document.querySelector('#sinks-rows tr[data-sink="out"]').dataset.status === 'ready'`)
	if n, _ := e.redis.Client().HExists(context.Background(), "ui:sinks", "paused:out").Result(); n {
		t.Fatal("Redis still has the pause after resume")
	}

	// The listing: the first page is the API's first page.
	var api struct {
		Messages []struct{ ID string } `json:"messages"`
	}
	e.do(http.MethodGet, "/v1/messages?limit=25", &api)
	var wantIDs []string
	for _, m := range api.Messages {
		wantIDs = append(wantIDs, m.ID)
	}
	rowIDs := `[...document.querySelectorAll('#browse-rows tr')].map((tr) => tr.dataset.id)`
	poll(t, ctx, "first page listed", fmt.Sprintf(`document.querySelectorAll('#browse-rows tr').length === %d`, len(wantIDs)))
	if got := value[[]string](t, ctx, rowIDs); !slices.Equal(got, wantIDs) {
		t.Fatalf("page lists %v, the API %v", got, wantIDs)
	}
	// The list shows each message's priority.
	if got := value[string](t, ctx, `document.querySelector('#browse-rows tr[data-id="urgent"] td.priority').textContent`); got != "7" {
		t.Errorf("urgent's priority shows %q, want 7", got)
	}
	// Filter by group, 5 per page: two pages.
	run(t, "filter by group", ctx,
		chromedp.SendKeys(chromedp.ID("f-group"), "cart-7"),
		chromedp.SetValue(chromedp.ID("f-limit"), "10"),
		chromedp.Click(chromedp.CSS("#browse-form button[type=submit]")),
	)
	poll(t, ctx, "group filter applied", `document.querySelectorAll('#browse-rows tr').length === 6 &&
		[...document.querySelectorAll('#browse-rows td.group')].every((td) => td.textContent === 'cart-7')`)
	run(t, "unfilter, 10 per page", ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('f-group').value = ''`),
		chromedp.Click(chromedp.CSS("#browse-form button[type=submit]")),
	)
	poll(t, ctx, "page 1 of 10", `document.querySelectorAll('#browse-rows tr').length === 10 && !document.getElementById('browse-next').disabled`)
	first := value[[]string](t, ctx, rowIDs)
	run(t, "next page", ctx, chromedp.Click(chromedp.ID("browse-next")))
	poll(t, ctx, "page 2", `document.getElementById('browse-page').textContent.startsWith('page 2')`)
	second := value[[]string](t, ctx, rowIDs)
	if len(second) != 10 || slices.Contains(second, first[9]) {
		t.Fatalf("page 2 %v overlaps page 1 %v", second, first)
	}

	// A message's detail: reschedule, fire now, cancel.
	run(t, "open order-00", ctx, chromedp.Click(chromedp.ID("browse-first")))
	poll(t, ctx, "order-00 listed", `!!document.querySelector('#browse-rows tr[data-id="order-00"] button.link')`)
	// The first page is drawn again on every poll; a row whose message is
	// unchanged stays the element it was, so a click on it is not lost.
	run(t, "mark order-00's row", ctx, chromedp.Evaluate[chromedp.Void](`document.querySelector('#browse-rows tr[data-id="order-00"]').kept = true`))
	for range 2 {
		at := value[string](t, ctx, `document.getElementById('updated').textContent`)
		poll(t, ctx, "the page polled again", fmt.Sprintf(`document.getElementById('updated').textContent !== %q`, at))
	}
	if !value[bool](t, ctx, `document.querySelector('#browse-rows tr[data-id="order-00"]').kept === true`) {
		t.Error("the listing drew order-00's row anew though its message did not change")
	}
	clickNow(t, ctx, "open order-00 from the listing", `#browse-rows tr[data-id="order-00"] button.link`)
	poll(t, ctx, "detail shown", `document.getElementById('lookup-title').textContent === 'order-00' &&
		!document.getElementById('reschedule-form').hidden && document.getElementById('lookup-facts').textContent.includes('cart-7')`)
	run(t, "reschedule in 3h", ctx, chromedp.SendKeys(chromedp.ID("reschedule-when"), "3h"))
	clickNow(t, ctx, "submit the reschedule", "#reschedule-form button[type=submit]")
	testenv.Eventually(t, 10*time.Second, func() bool {
		d := e.dueIn("order-00")
		return d > 179*time.Minute && d <= 3*time.Hour
	}, "Redis does not have order-00 due in 3h")
	run(t, "fire order-00", ctx, chromedp.Click(chromedp.ID("lookup-fire")))
	testenv.Eventually(t, 15*time.Second, func() bool { return e.gone("order-00") }, "order-00 not fired")
	// The route's destination has no stream, order-00 chose fired.orders:
	// it was delivered there.
	testenv.Eventually(t, 10*time.Second, func() bool {
		s, err := e.js.Stream(context.Background(), "FIRED")
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs >= 1
	}, "order-00 not delivered")
	run(t, "open order-04", ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('lookup-id').value = ''`),
		chromedp.SendKeys(chromedp.ID("lookup-id"), "order-04"),
	)
	clickNow(t, ctx, "look up order-04", "#lookup-form button[type=submit]")
	poll(t, ctx, "order-04 shown", `document.getElementById('lookup-title').textContent === 'order-04' && !document.getElementById('lookup-cancel').hidden`)
	run(t, "cancel order-04", ctx,
		chromedp.Click(chromedp.ID("lookup-cancel")),
		chromedp.WaitVisible(chromedp.CSS("#lookup-cancel.armed")),
		chromedp.Click(chromedp.ID("lookup-cancel")),
	)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.gone("order-04") }, "order-04 not cancelled")

	// A group: shown from the listing, then cancelled.
	run(t, "open group cart-9", ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('group-key').value = ''`),
		chromedp.SendKeys(chromedp.ID("group-key"), "cart-9"),
	)
	clickNow(t, ctx, "show group cart-9", "#group-form button[type=submit]")
	poll(t, ctx, "group shown", `document.getElementById('group-count').textContent.startsWith('6 messages') &&
		document.querySelectorAll('#group-rows tr').length === 6`)
	run(t, "cancel the group", ctx,
		chromedp.Click(chromedp.ID("group-cancel")),
		chromedp.WaitVisible(chromedp.CSS("#group-cancel.armed")),
		chromedp.Click(chromedp.ID("group-cancel")),
	)
	testenv.Eventually(t, 10*time.Second, func() bool {
		ids, err := e.uiStore().GroupMembers(context.Background(), "cart-9", 0)
		return err == nil && len(ids) == 0
	}, "group cart-9 not cancelled in Redis")
	poll(t, ctx, "group shown empty", `document.getElementById('group-message').textContent.includes('no message is filed')`)

	// Recurring schedules: both listed; end one series.
	poll(t, ctx, "recurring listed", `document.querySelectorAll('#recurring-rows tr').length === 2`)
	if got := value[string](t, ctx, `document.querySelector('#recurring-rows tr[data-id="heartbeat"] td.schedule').textContent`); got != "every 15m0s, 96 times" {
		t.Errorf("heartbeat's schedule shows %q", got)
	}
	// The other cart (its order-00 fired, order-04 cancelled) and the
	// daily report's detail, for the screenshot.
	run(t, "open group cart-7", ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('group-key').value = ''`),
		chromedp.SendKeys(chromedp.ID("group-key"), "cart-7"),
	)
	clickNow(t, ctx, "show group cart-7", "#group-form button[type=submit]")
	run(t, "look up daily-report", ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('lookup-id').value = ''`),
		chromedp.SendKeys(chromedp.ID("lookup-id"), "daily-report"),
	)
	clickNow(t, ctx, "submit the look-up", "#lookup-form button[type=submit]")
	poll(t, ctx, "group and detail for the screenshot", `document.getElementById('group-count').textContent.startsWith('4 messages') &&
		document.getElementById('lookup-facts').textContent.includes('Europe/Berlin')`)
	full, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	endBtn := `#recurring-rows tr[data-id="heartbeat"] button.cancel`
	clickNow(t, ctx, "end the heartbeat series", endBtn)
	poll(t, ctx, "end armed", fmt.Sprintf(`!!document.querySelector('%s.armed')`, endBtn))
	clickNow(t, ctx, "confirm the end of the heartbeat series", endBtn)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.gone("heartbeat") }, "the heartbeat series not ended")
	poll(t, ctx, "one series left", `document.querySelectorAll('#recurring-rows tr').length === 1`)

	saveScreenshot(t, "dashboard-operations.png", full)
	if errs := exceptions(); len(errs) > 0 {
		t.Errorf("the page threw:\n%s", strings.Join(errs, "\n"))
	}
}

// publishOK publishes a valid message (to fired.orders) with more headers.
func (e *env) publishOK(id string, headers ...string) {
	e.t.Helper()
	if err := e.publish(id, append([]string{"x-delay-destination", "fired.orders"}, headers...)...); err != nil {
		e.t.Fatal(err)
	}
}
