package ui

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The dashboard opens from a link that carries its token in the fragment,
// /#token=<token>, as `delaybridge dev` prints it: no
// dialog, the numbers shown, the token kept for the tab's session and gone
// from the address bar, and never sent to the server. A link with a wrong
// token opened in the same tab locks the page with the dialog's reason; one
// with the right token unlocks it again.
func TestDashboardOpensFromALink(t *testing.T) {
	e := newEnvToken(t, adminToken, "debug") // debug: the daemon logs every admin request with its path
	e.park("from-link", time.Hour)
	ctx, exceptions := startBrowser(t)

	run(t, "open the link", ctx, chromedp.Navigate(e.admin+"/#token="+url.QueryEscape(adminToken)))
	poll(t, ctx, "the page live without the dialog", `document.getElementById('conn').textContent === 'live' &&
		document.getElementById('token-dialog').hidden && document.getElementById('stat-parked').textContent === '1'`)
	if got := value[string](t, ctx, `sessionStorage.getItem('delaybridge.adminToken')`); got != adminToken {
		t.Errorf("sessionStorage holds %q, want the token of the link", got)
	}
	if href := value[string](t, ctx, `location.href`); href != e.admin+"/" {
		t.Errorf("the address bar shows %q, want %q: the token stays in it", href, e.admin+"/")
	}
	if value[bool](t, ctx, `document.getElementById('forget-token').hidden`) {
		t.Error("no Forget token button after a token from the link")
	}

	// The same tab reloaded keeps the token for its session.
	run(t, "reload", ctx, chromedp.Reload())
	poll(t, ctx, "live again after a reload", `document.getElementById('conn').textContent === 'live' &&
		document.getElementById('token-dialog').hidden`)

	// Another link in the same tab changes only the fragment.
	run(t, "open a link with a wrong token", ctx, chromedp.Navigate(e.admin+"/#token=not-the-token"))
	poll(t, ctx, "the dialog with the reason", `!document.getElementById('token-dialog').hidden &&
		document.getElementById('token-error').textContent.includes('rejected')`)
	run(t, "open the right link, with another fragment part", ctx, chromedp.Navigate(e.admin+"/#token="+adminToken+"&keep=1"))
	poll(t, ctx, "unlocked by the link", `document.getElementById('token-dialog').hidden &&
		document.getElementById('conn').textContent === 'live'`)
	if hash := value[string](t, ctx, `location.hash`); hash != "#keep=1" {
		t.Errorf("location.hash %q after the link, want #keep=1: only the token is taken out", hash)
	}

	if strings.Contains(e.proc.Output(), adminToken) || strings.Contains(e.proc.Output(), "not-the-token") {
		t.Errorf("a token of the links reached the server's log:\n%s", e.proc.Output())
	}
	if !strings.Contains(e.proc.Output(), "/v1/stats") {
		t.Errorf("the daemon's debug log has no admin request: the check above proves nothing:\n%s", e.proc.Output())
	}
	if errs := exceptions(); len(errs) > 0 {
		t.Errorf("the page threw: %v", errs)
	}
}
