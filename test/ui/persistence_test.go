package ui

import (
	"context"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// On a Redis that keeps nothing on disk the dashboard says so above its
// cards, with what to set, and stops saying it once Redis has AOF.
func TestDashboardWarnsOfRedisWithoutPersistence(t *testing.T) {
	e := newEnvToken(t, adminToken, "info", testenv.WithArgs("--appendonly", "no", "--save", ""))
	ctx, exceptions := startBrowser(t)
	run(t, "open the page and give the token", ctx,
		chromedp.Navigate(e.admin+"/"),
		chromedp.WaitVisible(chromedp.ID("token-dialog")),
		chromedp.SendKeys(chromedp.ID("token-input"), adminToken),
		chromedp.Click(chromedp.CSS("#token-form button[type=submit]")),
		chromedp.WaitNotVisible(chromedp.ID("token-dialog")),
	)
	poll(t, ctx, "the warning about Redis", `(() => {
	  const b = document.getElementById('redis-warning');
	  return !b.hidden && b.offsetHeight > 0 && b.textContent.includes('keeps nothing on disk') &&
	    b.textContent.includes('appendonly yes') && b.textContent.includes('appendfsync everysec');
	})()`)

	// AOF on, and every connection closed: the daemon reconnects, reads
	// the settings again, and the page drops the warning.
	rdb := e.redis.Client()
	if err := rdb.ConfigSet(context.Background(), "appendonly", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the warning gone with AOF on", `document.getElementById('redis-warning').hidden`)
	if errs := exceptions(); len(errs) > 0 {
		t.Errorf("the page threw: %v", errs)
	}
}
