package ui

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// attackerPage is a page of another origin that tries, from the visitor's
// browser, what an admin API without a token must withstand:
// park a message with a no-cors text/plain POST, retry a dead one, do the
// same with a plain HTML form (which needs no script), cancel and delete
// (which need a CORS preflight), and read the stats. ADMIN is the admin
// server's URL. window.results says what the browser let through.
const attackerPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>cats</title></head><body>
<iframe name="sink" hidden></iframe>
<form id="f" method="post" enctype="text/plain" target="sink" action="ADMIN/v1/messages">
<input type="hidden" name='{"id":"csrf-form","delay":"1h","sink":"out","destination":"fired.orders","body":"x' value='"}'>
</form>
<script>
const admin = 'ADMIN';
window.results = {};
async function attempt(name, url, init) {
  try {
    const r = await fetch(url, init);
    window.results[name] = 'sent ' + r.type + ' ' + r.status;
  } catch (e) {
    window.results[name] = 'error ' + e.message;
  }
}
(async () => {
  const park = JSON.stringify({id: 'csrf-parked', delay: '1h', sink: 'out', destination: 'fired.orders', body: 'x'});
  await attempt('park', admin + '/v1/messages', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: park});
  await attempt('retry', admin + '/v1/dead/victim-dead/retry', {method: 'POST', mode: 'no-cors'});
  await attempt('retryText', admin + '/v1/dead/victim-dead/retry', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: '{}'});
  await attempt('cancel', admin + '/v1/messages/victim-parked', {method: 'DELETE'});
  await attempt('delete', admin + '/v1/dead/victim-dead', {method: 'DELETE'});
  await attempt('read', admin + '/v1/stats', {});
  document.getElementById('f').submit();
  window.done = true;
})();
</script>
</body></html>`

// TestCrossSiteAttacksFromABrowser runs the daemon
// without admin.token and a page of another origin in headless chromium:
// the page's requests reach the daemon and change nothing. A DNS name
// re-bound to 127.0.0.1 (chromium's host resolver rules, and a Go client
// with a foreign Host) reads nothing. The dashboard itself still works.
func TestCrossSiteAttacksFromABrowser(t *testing.T) {
	e := newEnvToken(t, "", "debug")
	if out := e.proc.Output(); !strings.Contains(out, "the admin API has no token") {
		t.Errorf("no warning at start about the missing token:\n%s", out)
	}
	e.park("victim-parked", time.Hour)
	for _, id := range []string{"victim-dead", "ui-dead"} {
		if err := e.publish(id, "x-delay", "soon"); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		s := e.stats()
		return s.Parked == 1 && s.Dead == 2
	}, "fixture not parked and dead")

	page := strings.ReplaceAll(attackerPage, "ADMIN", e.admin)
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, page)
	}))
	t.Cleanup(attacker.Close)
	adminURL, _ := url.Parse(e.admin)
	ctx, exceptions := startBrowser(t, chromedp.Flag("host-resolver-rules", "MAP rebound.test 127.0.0.1"))

	// The same page from another port of 127.0.0.1 (same site, another
	// origin) and from localhost (another site).
	attackerPort := strings.TrimPrefix(attacker.URL, "http://127.0.0.1:")
	refusedBefore := strings.Count(e.proc.Output(), "status=403")
	for _, origin := range []string{"http://127.0.0.1:" + attackerPort, "http://localhost:" + attackerPort} {
		run(t, "open the attacker page at "+origin, ctx, chromedp.Navigate(origin+"/"))
		poll(t, ctx, "the attacks are done", `window.done === true`)
		results := value[map[string]string](t, ctx, `window.results`)
		t.Logf("%s: %v", origin, results)
		for _, name := range []string{"cancel", "delete", "read"} {
			if !strings.HasPrefix(results[name], "error") {
				t.Errorf("%s: %s was let through by the browser: %s", origin, name, results[name])
			}
		}
	}
	// Every state-changing request the browser sent was refused by the
	// daemon (2 pages x: no-cors park, two retries, the form).
	testenv.Eventually(t, 10*time.Second, func() bool {
		return strings.Count(e.proc.Output(), "status=403")-refusedBefore >= 8
	}, "the daemon did not refuse the attacker's requests: %s", lazy(func() string { return e.proc.Output() }))
	out := e.proc.Output()
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "admin request") && (strings.Contains(line, "method=POST") || strings.Contains(line, "method=DELETE")) &&
			!strings.Contains(line, "status=403") {
			t.Errorf("a state-changing request was not refused: %s", line)
		}
	}
	for _, c := range []struct {
		path string
		want int
	}{
		{"/v1/messages/csrf-parked", 404}, {"/v1/messages/csrf-form", 404},
		{"/v1/dead/victim-dead", 200}, {"/v1/messages/victim-parked", 200},
	} {
		if code, body := e.do(http.MethodGet, c.path, nil); code != c.want {
			t.Errorf("GET %s after the attacks: %d, want %d: %s", c.path, code, c.want, body)
		}
	}
	if s := e.stats(); s.Parked != 1 || s.Dead != 2 {
		t.Errorf("after the attacks: parked %d, dead %d; want 1 and 2", s.Parked, s.Dead)
	}

	// DNS rebinding: rebound.test resolves to 127.0.0.1 in the browser; the
	// page it loads, and what it asks for, is refused.
	rebound := "http://rebound.test:" + adminURL.Port()
	run(t, "open the rebound name", ctx, chromedp.Navigate(rebound+"/"))
	if text := value[string](t, ctx, `document.body.innerText`); !strings.Contains(text, "is not one this server answers to") {
		t.Errorf("the rebound name got the page: %.300s", text)
	}
	for _, path := range []string{"/v1/stats", "/v1/messages/victim-parked", "/v1/dead", "/readyz", "/metrics"} {
		status, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`fetch(%q).then((r) => r.status)`, path), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("fetch %s from %s: %v", path, rebound, err)
		}
		if status != http.StatusForbidden {
			t.Errorf("fetch %s from %s: %d, want 403", path, rebound, status)
		}
	}
	// The same with a Go client naming a foreign Host.
	for _, path := range []string{"/v1/messages/victim-parked", "/v1/dead", "/v1/stats"} {
		req, _ := http.NewRequest(http.MethodGet, e.admin+path, nil)
		req.Host = "rebound.example:" + adminURL.Port()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s with Host %s: %d, want 403", path, req.Host, resp.StatusCode)
		}
	}

	// The dashboard on its own origin: no token asked for, retry works, and
	// the content of a message is refused without a token.
	run(t, "open the dashboard", ctx, chromedp.Navigate(e.admin+"/"))
	poll(t, ctx, "dead list shown", `document.querySelectorAll('#dead-rows tr').length === 2`)
	clickNow(t, ctx, "retry ui-dead", `#dead-rows tr[data-id="ui-dead"] button.retry`)
	poll(t, ctx, "retried message shown as scheduled",
		`document.getElementById('lookup-title').textContent === 'ui-dead' &&
		 document.getElementById('lookup-state').textContent === 'scheduled'`)
	if code, _ := e.do(http.MethodGet, "/v1/dead/ui-dead", nil); code != http.StatusNotFound {
		t.Errorf("GET /v1/dead/ui-dead after the dashboard's retry: %d, want 404", code)
	}
	run(t, "ask for the content", ctx, chromedp.Click(chromedp.ID("lookup-content")))
	poll(t, ctx, "content refused without a token", `!document.getElementById('toast').hidden &&
		document.getElementById('toast').textContent.includes('admin.token')`)
	if json := value[string](t, ctx, `document.getElementById('lookup-json').textContent`); strings.Contains(json, `"headers"`) {
		t.Errorf("the lookup shows headers without a token: %s", json)
	}
	if errs := exceptions(); len(errs) > 0 {
		t.Errorf("the pages threw:\n%s", strings.Join(errs, "\n"))
	}
}
