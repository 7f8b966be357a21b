package dev

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
)

// dev prints the full link to its dashboard, with the admin token in the
// fragment: the admin URL it runs at, then
// /#token=<the token it keeps>. The page it opens is the dashboard, and the
// token of the link opens the API.
func TestDevPrintsTheDashboardLink(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // the in-process Redis: quick, and no redis-server needed
	dir := t.TempDir()
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Dir: dir, Out: out, Log: daemon.NewLogger(config.Log{Level: "warn", Format: "text"}, out), SelfPath: "delaybridge", NoWelcome: true})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev stopped with %v", err)
		}
	}()
	if !testenv.Poll(30*time.Second, func() bool { return strings.Contains(out.String(), "Ctrl-C stops everything") }) {
		t.Fatalf("dev did not start; output:\n%s", out.String())
	}
	m := regexp.MustCompile(`(?m)^  admin API +(http://\S+)\n  dashboard +(\S+) +\(open it in a browser`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("dev printed no dashboard link under the admin API:\n%s", out.String())
	}
	adminURL, link := m[1], m[2]
	token, err := os.ReadFile(filepath.Join(dir, TokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if want := adminURL + "/#token=" + strings.TrimSpace(string(token)); link != want {
		t.Errorf("dashboard link %q, want %q", link, want)
	}

	page, _ := get(t, link, "") // the fragment is not sent
	if !strings.Contains(page, `<script src="ui/app.js"`) {
		t.Errorf("%s does not serve the dashboard:\n%.300s", link, page)
	}
	_, code := get(t, adminURL+"/v1/stats", strings.TrimPrefix(link, adminURL+"/#token="))
	if code != http.StatusOK {
		t.Errorf("GET /v1/stats with the link's token: %d, want 200", code)
	}
}

// get GETs url (its fragment dropped, as a browser does) with the bearer
// token when given, and returns the body and status.
func get(t *testing.T, url, token string) (string, int) {
	t.Helper()
	url, _, _ = strings.Cut(url, "#")
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}
