package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// errNotFound is what a backend returns for an unknown ID.
var errNotFound = errors.New("not found")

// backend is where inspect, cancel, stats and dead act: Redis directly
// (with --config) or a running daemon's admin API (with --admin).
type backend interface {
	Inspect(ctx context.Context, id string, body bool) (*admin.MessageView, error)
	Cancel(ctx context.Context, id string) error
	Stats(ctx context.Context) (*admin.StatsView, error)
	ListDead(ctx context.Context, limit int) ([]admin.DeadView, error)
	RetryDead(ctx context.Context, id string) error
	PurgeDead(ctx context.Context) (int, error)
	Close()
}

// withBackend runs f against the admin API when --admin is given, else
// against the Redis of --config.
func (a *app) withBackend(cmd *cobra.Command, f func(ctx context.Context, b backend) error) error {
	ctx, stop := signalCtx(cmd)
	defer stop()
	if a.adminURL != "" {
		u, err := url.Parse(strings.TrimRight(a.adminURL, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return exit(2, fmt.Errorf("--admin %q: give the admin server's URL, e.g. http://127.0.0.1:7070", a.adminURL))
		}
		return f(ctx, &apiBackend{base: u.String(), token: a.token, client: &http.Client{Timeout: 30 * time.Second}})
	}
	cfg, err := a.load()
	if err != nil {
		return err
	}
	s, err := daemon.OpenStore(ctx, cfg, nil)
	if err != nil {
		return exit(1, err)
	}
	b := &redisBackend{s: s, cfg: cfg}
	defer b.Close()
	return f(ctx, b)
}

// redisBackend acts on Redis directly.
type redisBackend struct {
	s   *store.Store
	cfg *config.Config
}

func (b *redisBackend) Close() { _ = b.s.Client().Close() }

func notFound(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound
	}
	return err
}

func (b *redisBackend) Inspect(ctx context.Context, id string, body bool) (*admin.MessageView, error) {
	info, err := b.s.Inspect(ctx, id)
	if err != nil {
		return nil, notFound(err)
	}
	v := admin.NewMessageView(info, body)
	return &v, nil
}

func (b *redisBackend) Cancel(ctx context.Context, id string) error {
	return notFound(b.s.Cancel(ctx, id))
}

func (b *redisBackend) Stats(ctx context.Context) (*admin.StatsView, error) {
	st, err := b.s.Stats(ctx)
	if err != nil {
		return nil, err
	}
	v := admin.NewStatsView(st)
	return &v, nil
}

func (b *redisBackend) ListDead(ctx context.Context, limit int) ([]admin.DeadView, error) {
	infos, err := b.s.ListDead(ctx, limit)
	if err != nil {
		return nil, err
	}
	return admin.NewDeadViews(infos), nil
}

func (b *redisBackend) RetryDead(ctx context.Context, id string) error {
	return notFound(b.s.RetryDead(ctx, id))
}

func (b *redisBackend) PurgeDead(ctx context.Context) (int, error) { return b.s.PurgeDead(ctx) }

// apiBackend acts through the admin API.
type apiBackend struct {
	base   string
	token  string
	client *http.Client
}

func (b *apiBackend) Close() {}

// do sends a request and decodes a JSON answer into out (when non-nil). A
// 404 is errNotFound; other failures carry the server's reason.
func (b *apiBackend) do(ctx context.Context, method, path string, out any) error {
	return b.doBody(ctx, method, path, nil, out)
}

// doBody is do with a JSON request body (none when in is nil).
func (b *apiBackend) doBody(ctx context.Context, method, path string, in, out any) error {
	var reqBody io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return err
		}
		reqBody = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.base+path, reqBody)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if b.token != "" {
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	switch {
	case resp.StatusCode == http.StatusNotFound && e.Error != "":
		return fmt.Errorf("%w: %s", errNotFound, e.Error)
	case resp.StatusCode == http.StatusNotFound:
		return errNotFound
	case resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("admin API: 401 unauthorized: give the admin token with --token or DELAYBRIDGE_ADMIN_TOKEN")
	case resp.StatusCode >= 300:
		if e.Error != "" {
			return fmt.Errorf("admin API: %s: %s", resp.Status, e.Error)
		}
		return fmt.Errorf("admin API: %s", resp.Status)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("admin API: unexpected answer: %w", err)
		}
	}
	return nil
}

func escapeID(id string) string { return url.PathEscape(id) }

func (b *apiBackend) Inspect(ctx context.Context, id string, body bool) (*admin.MessageView, error) {
	path := "/v1/messages/" + escapeID(id)
	if body {
		path += "?body=true"
	}
	var v admin.MessageView
	if err := b.do(ctx, http.MethodGet, path, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

func (b *apiBackend) Cancel(ctx context.Context, id string) error {
	return b.do(ctx, http.MethodDelete, "/v1/messages/"+escapeID(id), nil)
}

func (b *apiBackend) Stats(ctx context.Context) (*admin.StatsView, error) {
	var v admin.StatsView
	if err := b.do(ctx, http.MethodGet, "/v1/stats", &v); err != nil {
		return nil, err
	}
	return &v, nil
}

func (b *apiBackend) ListDead(ctx context.Context, limit int) ([]admin.DeadView, error) {
	var v []admin.DeadView
	err := b.do(ctx, http.MethodGet, fmt.Sprintf("/v1/dead?limit=%d", limit), &v)
	return v, err
}

func (b *apiBackend) RetryDead(ctx context.Context, id string) error {
	return b.do(ctx, http.MethodPost, "/v1/dead/"+escapeID(id)+"/retry", nil)
}

// PurgeDead deletes the dead messages one by one, as the API lists them.
func (b *apiBackend) PurgeDead(ctx context.Context) (int, error) {
	total := 0
	for {
		dead, err := b.ListDead(ctx, 1000)
		if err != nil || len(dead) == 0 {
			return total, err
		}
		for _, d := range dead {
			err := b.do(ctx, http.MethodDelete, "/v1/dead/"+escapeID(d.ID), nil)
			if err != nil && !errors.Is(err, errNotFound) {
				return total, err
			}
			total++
		}
	}
}

// withStore runs f against the Redis of --config, for the commands that
// only work there (reencrypt).
func (a *app) withStore(cmd *cobra.Command, f func(ctx context.Context, s *store.Store) error) error {
	cfg, err := a.load()
	if err != nil {
		return err
	}
	ctx, stop := signalCtx(cmd)
	defer stop()
	s, err := daemon.OpenStore(ctx, cfg, nil)
	if err != nil {
		return exit(1, err)
	}
	defer s.Client().Close()
	return f(ctx, s)
}
