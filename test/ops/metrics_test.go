package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// dashboard is the part of a Grafana dashboard these tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // a collapsed row's
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

// query is one PromQL expression of an artifact, and where it is.
type query struct {
	where, expr string
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// dashboardQueries lists every panel query (also in collapsed rows) and every
// query variable's query (label_values(metric, label): its metric selector).
func dashboardQueries(t *testing.T, d dashboard) []query {
	t.Helper()
	var qs []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" || p.Type == "text" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("dashboard panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("dashboard panel %q: query %s is empty", p.Title, tg.RefID)
				}
				qs = append(qs, query{fmt.Sprintf("dashboard panel %q query %s", p.Title, tg.RefID), tg.Expr})
			}
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("dashboard variable %s: query %s", v.Name, v.Query)
			}
		}
		m := labelValues.FindStringSubmatch(strings.TrimSpace(q.Query))
		if m == nil {
			t.Errorf("dashboard variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
			continue
		}
		qs = append(qs, query{"dashboard variable " + v.Name, m[1]})
	}
	return qs
}

// ruleQueries lists every expression of the rules, and the names they record.
func ruleQueries(t *testing.T) (qs []query, recorded []string) {
	for _, r := range loadRules(t) {
		name := r.Alert
		if r.Record != "" {
			name = r.Record
			recorded = append(recorded, r.Record)
		}
		qs = append(qs, query{"rule " + name, r.Expr})
	}
	return qs, recorded
}

// The dashboard parses, and a panel shows each metric an operator watches
// (listed below with what it shows).
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard needs a uid and a title")
	}
	var all []queryUse
	for _, q := range dashboardQueries(t, d) {
		u, err := parseQuery(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		all = append(all, u)
	}
	names := metricNames(all)
	for _, want := range []string{
		"delaybridge_ingest_messages_total", "delaybridge_sink_published_total", // rates in and out
		"delaybridge_fire_lateness_seconds_bucket",                // lateness percentiles
		"delaybridge_parked_messages", "delaybridge_due_messages", // parked and due
		"delaybridge_dead_total", "delaybridge_retries_total", // dead, retries
		"delaybridge_held_messages",                            // held for a paused or down sink
		"delaybridge_forecast_messages",                        // what fires when
		"delaybridge_connection_up", "delaybridge_sink_paused", // per-sink state, with the pause
		"delaybridge_redis_script_duration_seconds_bucket", // Redis round trips
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no dashboard panel shows %s", want)
		}
	}
}

// Every metric name in every dashboard panel (and variable) and in every rule
// exists in the /metrics of a running delaybridge, with the labels the queries
// match on and group by. The daemon runs against a real Redis and NATS, and
// messages go through it that fire, are rejected, and fail and die, so that the
// labelled series exist. Exempt: the names the rules record (which only the
// rules use; the dashboard must work without them) and Prometheus's own up.
func TestQueriesUseRealMetrics(t *testing.T) {
	ruleQs, recorded := ruleQueries(t)
	dashQs := dashboardQueries(t, loadDashboard(t))

	// Also let promtool (2.42, as a Prometheus of that age would) parse the
	// dashboard's queries, as recording rules of a scratch rule file.
	type scratchRule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var scratch []scratchRule
	for i, q := range dashQs {
		scratch = append(scratch, scratchRule{fmt.Sprintf("dashboard_query_%d", i), grafanaVars.Replace(q.expr)})
	}
	b, _ := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": scratch}}})
	scratchFile := filepath.Join(t.TempDir(), "dashboard.rules.json")
	if err := os.WriteFile(scratchFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, ".", "check", "rules", scratchFile)

	fams := scrapeBusyDaemon(t)

	for _, q := range append(ruleQs, dashQs...) {
		u, err := parseQuery(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		dashboardQuery := strings.HasPrefix(q.where, "dashboard")
		exempt := func(name string) bool {
			return name == "up" || !dashboardQuery && slices.Contains(recorded, name)
		}
		for _, s := range u.selectors {
			if exempt(s.metric) {
				continue
			}
			fam, err := family(fams, s.metric)
			if err != nil {
				t.Errorf("%s: %v\n  query: %s", q.where, err, q.expr)
				continue
			}
			for _, l := range s.labels {
				if !targetLabel(l) && !hasLabel(fam, l) {
					t.Errorf("%s: %s has no series with label %q\n  query: %s", q.where, s.metric, l, q.expr)
				}
			}
		}
		for _, g := range u.grouping {
			for _, l := range g.labels {
				if targetLabel(l) || l == "le" { // le: a histogram's bucket bound
					continue
				}
				found := false
				for _, m := range g.metrics {
					fam, err := family(fams, m)
					// a missing metric is reported above, not again here
					found = found || exempt(m) || err != nil || hasLabel(fam, l)
				}
				if !found {
					t.Errorf("%s: groups by %q, a label none of %v has\n  query: %s", q.where, l, g.metrics, q.expr)
				}
			}
		}
	}
}

// family finds the metric family a query's metric name selects series of: a
// histogram's series are its name with _bucket, _sum or _count.
func family(fams map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, error) {
	if f, ok := fams[name]; ok {
		if t := f.GetType(); t == dto.MetricType_HISTOGRAM || t == dto.MetricType_SUMMARY {
			return nil, fmt.Errorf("%s is a %s: its series are %s_bucket, _sum and _count", name, strings.ToLower(t.String()), name)
		}
		return f, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if f, ok := fams[base]; ok {
			t := f.GetType()
			if t == dto.MetricType_HISTOGRAM || suffix != "_bucket" && t == dto.MetricType_SUMMARY {
				return f, nil
			}
		}
	}
	return nil, fmt.Errorf("metric %s is not in the daemon's /metrics", name)
}

// targetLabel reports whether Prometheus adds the label to every scraped series.
func targetLabel(name string) bool { return name == "job" || name == "instance" }

func hasLabel(f *dto.MetricFamily, name string) bool {
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return true
			}
		}
	}
	return false
}

// scrapeBusyDaemon runs delaybridge between a real Redis (with maxmemory, and
// limits.max_redis_memory set, so that both memory limits are reported) and an
// embedded NATS, sends messages that fire, one that is rejected and one whose
// subject no stream stores (retried, then dead), waits until the metrics show
// all of it, and returns a scrape of /metrics.
func scrapeBusyDaemon(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	redis := testenv.Redis(t, testenv.WithArgs("--maxmemory", "256mb", "--maxmemory-policy", "noeviction"))
	ns := testenv.NATS(t)
	js := jetStream(t, ns, map[string]string{"DELAYED": "delayed.>", "FIRED": "fired.ok"})
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: ops}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, max_attempts: 2, backoff: {initial: 50ms, max: 100ms}}
limits: {max_redis_memory: 200000000}
shutdown_timeout: 20s
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    route: {sink: out, destination: fired.ok, allow_override: true, allowed_destinations: ["fired.*"]}
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`, redis.Addr, ns.URL, ns.URL))
	defer d.stop()

	for i := range 5 {
		publish(t, js, "delayed.ok", "x-delay", "50ms", "x-message-id", fmt.Sprintf("ok-%d", i))
	}
	publish(t, js, "delayed.bad", "x-delay", "banana", "x-message-id", "bad")
	publish(t, js, "delayed.lost", "x-delay", "50ms", "x-message-id", "lost", "x-delay-destination", "fired.nowhere")

	var fams map[string]*dto.MetricFamily
	testenv.Eventually(t, 30*time.Second, func() bool {
		fams = d.metrics()
		published, _ := value(fams, "delaybridge_sink_published_total", map[string]string{"sink": "out"})
		deadSink, _ := value(fams, "delaybridge_dead_total", map[string]string{"source": "sink"})
		rejected, _ := value(fams, "delaybridge_ingest_rejected_total", map[string]string{"ingest": "in"})
		return published == 5 && deadSink == 1 && rejected == 1
	}, "the messages did not all fire, die and get rejected")
	return fams
}

// jetStream connects to ns and creates the given streams (name -> subject).
func jetStream(t *testing.T, ns *testenv.NATSServer, streams map[string]string) jetstream.JetStream {
	t.Helper()
	_, js := ns.Client(t)
	for name, subject := range streams {
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
			t.Fatal(err)
		}
	}
	return js
}

// publish sends one message with the given headers (key, value, ...) to the
// ingest stream.
func publish(t *testing.T, js jetstream.JetStream, subject string, headers ...string) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(`{"ops":true}`)
	for i := 0; i+1 < len(headers); i += 2 {
		m.Header.Add(headers[i], headers[i+1])
	}
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}
