package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/config"
)

// healthCmd probes a running daemon's admin server, for container
// HEALTHCHECKs in images without curl. It passes only on delaybridge's own
// answer (200 with {"status":"ok"} from /healthz, {"status":"ready"} from
// /readyz), so that a probe pointed at the wrong port or path fails.
func (a *app) healthCmd() *cobra.Command {
	var (
		rawURL  string
		ready   bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use: "health [--ready] [-c FILE | --admin URL]",
		Example: `  delaybridge health -c /etc/delaybridge/config.yaml --ready   # a container's readiness probe: admin.listen (and admin.tls) from the file
  delaybridge health --admin http://127.0.0.1:7070              # liveness: GET /healthz
  delaybridge health --admin https://10.0.0.7:7070 --ready      # GET /readyz over HTTPS`,
		Short: "Exit 0 when a running daemon answers /healthz (or /readyz with --ready) with 200",
		Long: `Probes a running daemon's admin server: GET /healthz (the process runs), or with --ready
GET /readyz (Redis and every ingest and sink are connected). It exits 0 only on delaybridge's
own answer, 1 otherwise (not reachable, not ready, or something else answering), 2 on a usage
error.

The server is, in this order: --admin (or --url, its older name) with the admin server's base
URL; admin.listen of --config, over HTTPS when admin.tls is set (the probe then trusts exactly
the certificate of admin.tls.cert_file); $DELAYBRIDGE_ADMIN; else http://127.0.0.1:7070.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/healthz"
			if ready {
				path = "/readyz"
			}
			t, err := a.healthTarget(cmd, rawURL, path)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return a.probe(ctx, t)
		},
	}
	cmd.Flags().StringVar(&rawURL, "url", "", "the admin server's base URL, as --admin (kept for existing probes)")
	cmd.Flags().BoolVar(&ready, "ready", false, "probe /readyz (ready to work) instead of /healthz (running)")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	return cmd
}

// healthTarget is what one probe asks.
type healthTarget struct {
	url    string
	host   string // Host header, when not the URL's
	client *http.Client
	want   string // the "status" of delaybridge's 200 answer
}

func (a *app) healthTarget(cmd *cobra.Command, rawURL, path string) (*healthTarget, error) {
	want := map[string]string{"/healthz": "ok", "/readyz": "ready"}[path]
	base := rawURL
	adminGiven := cmd.Flags().Changed("admin")
	switch {
	case base != "" && adminGiven && strings.TrimRight(base, "/") != strings.TrimRight(a.adminURL, "/"):
		return nil, exit(2, fmt.Errorf("--url %s and --admin %s name two servers; give one (--url is the older name of --admin)", base, a.adminURL))
	case base == "" && adminGiven:
		base = a.adminURL
	case base == "" && a.configPath != "":
		return a.healthFromConfig(path, want)
	case base == "":
		base = a.adminURL // $DELAYBRIDGE_ADMIN
	}
	if base == "" {
		base = "http://" + config.DefaultAdminListen
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, exit(2, fmt.Errorf("%q is not the URL of an admin server; write it as http://HOST:PORT (or https://)", base))
	}
	switch p := strings.TrimRight(u.Path, "/"); {
	case p == "":
		u.Path = path
	case p == "/readyz" || (p == "/healthz" && path == "/healthz"):
		// A URL that names the route probes it (existing probes write
		// .../readyz without --ready).
		u.Path, want = p, map[string]string{"/healthz": "ok", "/readyz": "ready"}[p]
	case p == "/healthz":
		return nil, exit(2, fmt.Errorf("%s asks /healthz, but --ready asks /readyz; give the base URL, %s://%s", base, u.Scheme, u.Host))
	default:
		return nil, exit(2, fmt.Errorf("%s: give the admin server's base URL (%s://%s): health asks /healthz, or /readyz with --ready", base, u.Scheme, u.Host))
	}
	return &healthTarget{url: u.String(), client: &http.Client{}, want: want}, nil
}

// healthFromConfig probes the admin server the configuration describes:
// admin.listen (a wildcard address is asked on loopback), HTTPS with
// admin.tls, and a Host the server answers to.
func (a *app) healthFromConfig(path, want string) (*healthTarget, error) {
	cfg, err := a.load()
	if err != nil {
		return nil, err
	}
	listen := cfg.Admin.Listen
	if listen == "" {
		return nil, exit(2, fmt.Errorf("%s: admin.listen is empty, so the daemon has no admin server to ask; set admin.listen (e.g. %s)", a.configPath, config.DefaultAdminListen))
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, exit(2, fmt.Errorf("%s: admin.listen %q is not host:port", a.configPath, listen))
	}
	dial := host
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		dial = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			dial = "::1"
		}
	}
	t := &healthTarget{want: want, client: &http.Client{}}
	scheme := "http"
	if tc := cfg.Admin.TLS; tc.CertFile != "" {
		scheme = "https"
		pinned, err := pinnedTLS(tc.CertFile)
		if err != nil {
			return nil, exit(2, fmt.Errorf("%s: admin.tls.cert_file: %w", a.configPath, err))
		}
		t.client.Transport = &http.Transport{TLSClientConfig: pinned}
	}
	t.url = scheme + "://" + net.JoinHostPort(dial, port) + path
	if hs := cfg.Admin.AllowedHosts; len(hs) > 0 {
		t.host = net.JoinHostPort(hs[0], port)
	}
	return t, nil
}

// pinnedTLS trusts exactly the certificate in certFile (the admin server's
// own), whatever name the probe dials it by.
func pinnedTLS(certFile string) (*tls.Config, error) {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate in it")
	}
	want := block.Bytes
	if _, err := x509.ParseCertificate(want); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain is not verified by name: the probe dials 127.0.0.1 or
		// the listen address, which the certificate need not name. It is
		// verified by being the configured certificate, byte for byte.
		InsecureSkipVerify: true, //nolint:gosec // replaced by the pin below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], want) {
				return errors.New("the server's certificate is not the one in admin.tls.cert_file")
			}
			return nil
		},
	}, nil
}

// probe asks once and accepts only delaybridge's own answer.
func (a *app) probe(ctx context.Context, t *healthTarget) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return exit(2, err)
	}
	if t.host != "" {
		req.Host = t.host
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return exit(1, fmt.Errorf("%s: %w (is the daemon running, and is this its admin address?)", t.url, err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var answer struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	isJSON := strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && json.Unmarshal(body, &answer) == nil
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable && isJSON && answer.Status == "not ready":
		return exit(1, fmt.Errorf("%s: not ready: %s", t.url, answer.Error))
	case resp.StatusCode != http.StatusOK:
		return exit(1, fmt.Errorf("%s: %s %s", t.url, resp.Status, bytes.TrimSpace(body)))
	case !isJSON || answer.Status != t.want:
		return exit(1, fmt.Errorf("%s: 200, but not delaybridge's answer (%s wanted {\"status\":%q}): is this the admin server's address?",
			t.url, req.URL.Path, t.want))
	}
	fmt.Fprintf(a.stdout, "%s: %s\n", t.url, answer.Status)
	return nil
}
