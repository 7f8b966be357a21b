// Package e2e runs the real delaybridge binary against real servers started
// by the tests (redis-server, embedded NATS, kfake, a RabbitMQ node).
package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
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

// Parallel tests. A test that starts servers of its own only (testenv.Redis,
// NATS, Kafka: not the package's one RabbitMQ node), changes no process
// state (os.Setenv) and asserts no timing bound that the other tests' load
// could break calls t.Parallel(): they run together after the others, so
// that the package takes less than the sum of its tests' waits.

// daemon is a delaybridge process under test.
type daemon struct {
	t       *testing.T
	bin     string
	cfgPath string
	admin   string // http://host:port
	proc    *testenv.Process
	env     []string
}

// startDaemon writes cfg (a YAML config whose admin.listen is %ADMIN%) and
// runs `delaybridge run` on it until /readyz answers 200.
func startDaemon(t *testing.T, cfg string, env ...string) *daemon {
	t.Helper()
	return startDaemonBin(t, "", cfg, env...)
}

// startDaemonBin is startDaemon with the binary bin (testenv.BuildTagged);
// "" is testenv.Build's.
func startDaemonBin(t *testing.T, bin, cfg string, env ...string) *daemon {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg = strings.ReplaceAll(cfg, "%ADMIN%", addr)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if bin == "" {
		bin = testenv.Build(t)
	}
	d := &daemon{t: t, bin: bin, cfgPath: path, admin: "http://" + addr, env: env}
	d.start()
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	d.proc = testenv.StartProcessWith(d.t, testenv.ProcessOptions{Env: d.env}, d.bin, "run", "--config", d.cfgPath)
	testenv.Eventually(d.t, 30*time.Second, func() bool {
		if d.proc.Exited() {
			d.t.Fatalf("delaybridge exited at start:\n%s", d.proc.Output())
		}
		code, _ := d.get("/readyz", nil)
		return code == http.StatusOK
	}, "delaybridge not ready")
}

// stop sends SIGTERM and expects a clean exit 0.
func (d *daemon) stop() {
	d.t.Helper()
	d.proc.Signal(syscall.SIGTERM)
	if code := d.proc.Wait(60 * time.Second); code != 0 {
		d.t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, d.proc.Output())
	}
}

// get fetches an admin path and decodes JSON into v (when non-nil).
func (d *daemon) get(path string, v any) (int, string) {
	return d.do(http.MethodGet, path, v)
}

func (d *daemon) do(method, path string, v any) (int, string) {
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
	if v != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(body, v); err != nil {
			d.t.Fatalf("%s %s: %v in %s", method, path, err, body)
		}
	}
	return resp.StatusCode, string(body)
}

type stats struct {
	Parked int64 `json:"parked"`
	Due    int64 `json:"due"`
	Dead   int64 `json:"dead"`
}

func (d *daemon) stats() stats {
	var s stats
	if code, body := d.get("/v1/stats", &s); code != http.StatusOK {
		d.t.Fatalf("stats: %d %s", code, body)
	}
	return s
}

type deadMessage struct {
	ID          string `json:"id"`
	Reason      string `json:"reason"`
	Sink        string `json:"sink"`
	Destination string `json:"destination"`
}

func (d *daemon) dead() []deadMessage {
	var out []deadMessage
	if code, body := d.get("/v1/dead?limit=10000", &out); code != http.StatusOK {
		d.t.Fatalf("dead: %d %s", code, body)
	}
	return out
}

// latency summarises lateness samples.
type latency []time.Duration

func (l latency) summary() string {
	if len(l) == 0 {
		return "no samples"
	}
	s := append(latency(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", len(s), q(.50), q(.99), s[len(s)-1])
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

// metricValue sums a counter, gauge or histogram count over the series
// whose labels include want.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	var sum float64
	found := false
series:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue series
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}
