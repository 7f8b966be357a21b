// Package ops checks the operations artifacts against the real thing: the
// Prometheus rules in deploy/prometheus with promtool (check rules, and their
// unit tests), and the metric names in those rules and in every panel of the
// Grafana dashboard in deploy/grafana against the /metrics of a running
// delaybridge, so that neither rots when a metric is renamed.
package ops

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// The artifacts, relative to this directory.
var (
	rulesFile     = filepath.Join("..", "..", "deploy", "prometheus", "delaybridge.rules.yml")
	rulesTestFile = filepath.Join("..", "..", "deploy", "prometheus", "delaybridge.rules_test.yml")
	dashboardFile = filepath.Join("..", "..", "deploy", "grafana", "delaybridge.json")
	operationsDoc = filepath.Join("..", "..", "docs", "operations.md")
)

// daemon is a delaybridge process under test.
type daemon struct {
	t     *testing.T
	admin string // http://host:port
	proc  *testenv.Process
}

// startDaemon writes cfg (a YAML config whose admin.listen is %ADMIN%), runs
// `delaybridge run` on it and waits until /readyz answers 200.
func startDaemon(t *testing.T, cfg string) *daemon {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(cfg, "%ADMIN%", addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, admin: "http://" + addr}
	d.proc = testenv.StartProcessWith(t, testenv.ProcessOptions{}, testenv.Build(t), "run", "--config", path)
	testenv.Eventually(t, 30*time.Second, func() bool {
		if d.proc.Exited() {
			t.Fatalf("delaybridge exited at start:\n%s", d.proc.Output())
		}
		code, _ := d.do(http.MethodGet, "/readyz")
		return code == http.StatusOK
	}, "delaybridge not ready")
	return d
}

// stop sends SIGTERM and expects a clean exit 0 (66 would be a data race).
func (d *daemon) stop() {
	d.t.Helper()
	d.proc.Signal(syscall.SIGTERM)
	if code := d.proc.Wait(60 * time.Second); code != 0 {
		d.t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, d.proc.Output())
	}
}

func (d *daemon) do(method, path string) (int, string) {
	req, err := http.NewRequest(method, d.admin+path, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metrics scrapes /metrics and parses it with the Prometheus text parser.
func (d *daemon) metrics() map[string]*dto.MetricFamily {
	d.t.Helper()
	resp, err := http.Get(d.admin + "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		d.t.Fatalf("/metrics is not valid Prometheus text: %v", err)
	}
	return fams
}

// value sums the values (a histogram's count) of a family's series whose labels
// include want; ok is false when there is no such series.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (sum float64, ok bool) {
series:
	for _, m := range fams[name].GetMetric() {
		for k, v := range want {
			if labelValue(m, k) != v {
				continue series
			}
		}
		ok = true
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, ok
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
