package deploy_test

// The Helm chart (helm/delaybridge), checked with helm itself: `helm lint
// --strict` and `helm template` for each set-up, each rendered manifest then
// decoded strictly and cross-checked exactly as kubernetes/ is
// (checkKubernetes, on the rendered files laid out like kubernetes/). The
// Prometheus Operator objects are decoded strictly with their own API types.
// helm must be installed (scripts/test-deps.sh, part of `make test`); the
// tests fail without it.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	helmDir   = "helm"
	chartName = "delaybridge"
	// helmVersion is what scripts/test-deps.sh installs.
	helmVersion = "v3.22.0"
	// helmKubeVersion is the Kubernetes version the charts are rendered for:
	// the least the sidecar shape needs (native sidecars). Given explicitly,
	// because a helm built with `go install` assumes v1.20 (its release
	// builds stamp the version of their client-go).
	helmKubeVersion = "1.29.0"
	// helmNamespace is the namespace the tests render into.
	helmNamespace = "messaging"
	rulesFile     = "prometheus/delaybridge.rules.yml"
	// chartRulesFile is the chart's copy of rulesFile (helm reads no file
	// outside the chart).
	chartRulesFile = "files/delaybridge.rules.yml"
)

var (
	chartDir      = filepath.Join(helmDir, chartName)
	exampleAppDir = filepath.Join(helmDir, "examples", "orders-app")
)

// The templates that render Prometheus Operator objects; every other one
// renders objects of the API types that checkKubernetes decodes.
var monitoringTemplates = map[string]bool{"servicemonitor.yaml": true, "prometheusrule.yaml": true}

// helmBinary is helm on PATH, else in $(go env GOBIN) or $(go env GOPATH)/bin,
// where scripts/test-deps.sh puts it.
var helmBinary = sync.OnceValues(func() (string, error) {
	if p, err := exec.LookPath("helm"); err == nil {
		return p, nil
	}
	var tried []string
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err != nil {
		return "", fmt.Errorf("helm is not on PATH, and go env failed: %v", err)
	}
	lines := strings.Split(string(out), "\n") // GOBIN's line may be empty
	var dirs []string
	if len(lines) > 0 && strings.TrimSpace(lines[0]) != "" {
		dirs = append(dirs, strings.TrimSpace(lines[0]))
	}
	if len(lines) > 1 {
		for _, gp := range filepath.SplitList(strings.TrimSpace(lines[1])) {
			dirs = append(dirs, filepath.Join(gp, "bin"))
		}
	}
	for _, d := range dirs {
		p := filepath.Join(d, "helm")
		tried = append(tried, p)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("helm is not on PATH nor at %s: run `make deps` (scripts/test-deps.sh installs helm %s with go install)", strings.Join(tried, ", "), helmVersion)
})

// runHelm runs helm with its state directories in a temp dir (no repository
// list or plugin of the user's) and returns what it printed.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := helmBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = helmEnv(t)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// helmEnv is the environment helm runs in: its state directories in a temp
// dir and no kubeconfig.
func helmEnv(t *testing.T) []string {
	home := t.TempDir()
	return append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"), // never a real cluster
	)
}

// helmSetup is one way to install the chart: a chart directory and values.
type helmSetup struct {
	name    string
	chart   func(t *testing.T) string // the chart directory to lint and render
	release string
	values  []string // helm flags: -f FILE, --set K=V
}

// thisChart is helm/delaybridge as it is.
func thisChart(*testing.T) string { return chartDir }

// exampleApp is the sidecar example, an application chart with delaybridge
// as a dependency, in a temp dir with the chart in its charts/ (what `helm
// dependency update` does for its file:// repository, without helm's
// repository machinery).
func exampleApp(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "orders-app")
	copyApp(t, dir)
	copyTree(t, chartDir, filepath.Join(dir, "charts", chartName))
	return dir
}

// copyApp copies the example application's chart to dir without what a
// `helm dependency build` left in the checkout (its charts/ and
// Chart.lock, which deploy/README.md tells a reader to make): the tests put
// the chart as it is in charts/ themselves.
func copyApp(t *testing.T, dir string) {
	t.Helper()
	copyTree(t, exampleAppDir, dir)
	for _, built := range []string{"charts", "Chart.lock"} {
		if err := os.RemoveAll(filepath.Join(dir, built)); err != nil {
			t.Fatal(err)
		}
	}
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func ciValues(name string) string { return filepath.Join(chartDir, "ci", name) }

// rendered is what `helm template` made of one set-up.
type rendered struct {
	dir        string      // laid out like deploy/: Dockerfile, kubernetes/*.yaml
	objs       []k8sObject // kubernetes/*.yaml, decoded strictly (loadKubernetes)
	monitoring []k8sObject // the Prometheus Operator objects, decoded strictly
	ps         problems    // what loading found wrong
}

// lintAndRender runs `helm lint --strict` and `helm template` on s, and
// decodes every manifest. The rendered files are laid out like deploy/
// (a copy of the Dockerfile, the manifests in kubernetes/ with a
// kustomization naming them), so that checkKubernetes runs on them as on
// deploy/kubernetes.
func lintAndRender(t *testing.T, s helmSetup) *rendered {
	t.Helper()
	chart := s.chart(t)
	lintArgs := append([]string{"lint", "--strict", "--kube-version", helmKubeVersion, "--namespace", helmNamespace, chart}, s.values...)
	if out, err := runHelm(t, lintArgs...); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(lintArgs, " "), err, out)
	}
	outDir := t.TempDir()
	tmplArgs := append([]string{"template", s.release, chart, "--kube-version", helmKubeVersion, "--namespace", helmNamespace, "--output-dir", outDir}, s.values...)
	if out, err := runHelm(t, tmplArgs...); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(tmplArgs, " "), err, out)
	}

	r := &rendered{dir: t.TempDir()}
	k8sDir := filepath.Join(r.dir, kubernetesDir)
	if err := os.MkdirAll(k8sDir, 0o755); err != nil {
		t.Fatal(err)
	}
	df, ok := readFile(&r.ps, dockerfileName)
	if !ok {
		t.Fatal(r.ps)
	}
	if err := os.WriteFile(filepath.Join(r.dir, dockerfileName), df, 0o644); err != nil {
		t.Fatal(err)
	}
	var resources, monitoringFiles []string
	err := filepath.WalkDir(outDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(outDir, p) // <app>/charts/delaybridge/templates/<file>
		name := strings.ReplaceAll(filepath.ToSlash(rel), "/", "_")
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if monitoringTemplates[filepath.Base(p)] {
			file := filepath.Join(r.dir, name)
			monitoringFiles = append(monitoringFiles, file)
			return os.WriteFile(file, data, 0o644)
		}
		resources = append(resources, name)
		return os.WriteFile(filepath.Join(k8sDir, name), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	kust, err := yaml.Marshal(map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k8sDir, kustomizationName), kust, 0o644); err != nil {
		t.Fatal(err)
	}
	r.objs = loadKubernetes(&r.ps, r.dir)
	r.monitoring = loadMonitoring(&r.ps, monitoringFiles)
	return r
}

// monitoringDecoder decodes the Prometheus Operator's monitoring.coreos.com/v1
// objects as strictly as k8sDecoder decodes the built-in ones (the same
// codec factory, with the operator's own API types).
var monitoringDecoder = sync.OnceValue(func() runtime.Decoder {
	scheme := runtime.NewScheme()
	if err := monitoringv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
})

// loadMonitoring decodes every document of files with monitoringDecoder.
func loadMonitoring(ps *problems, files []string) []k8sObject {
	var objs []k8sObject
	for _, file := range files {
		data, ok := readFile(ps, file)
		if !ok {
			continue
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 1; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				ps.add("%s: document %d: %v", file, i, err)
				break
			}
			if !hasContent(doc) {
				continue
			}
			obj, gvk, err := monitoringDecoder().Decode(doc, nil, nil)
			if err != nil {
				ps.add("%s: document %d: %v", file, i, err)
				continue
			}
			m, err := metaOf(obj)
			if err != nil || m.GetName() == "" {
				ps.add("%s: document %d (%s) has no metadata.name", file, i, gvk.Kind)
				continue
			}
			objs = append(objs, k8sObject{file: file, kind: gvk.Kind, name: m.GetName(), obj: obj})
		}
	}
	return objs
}

// report fails t with ps, each problem without the temp dir.
func (r *rendered) report(t *testing.T, s helmSetup, ps problems) {
	t.Helper()
	for _, p := range ps {
		t.Errorf("helm template %s (%s): %s", s.release, s.name, strings.ReplaceAll(p, r.dir+string(filepath.Separator), ""))
	}
}

// kinds is every rendered kind with its names, "Kind/name" sorted.
func kinds(objs ...[]k8sObject) []string {
	var out []string
	for _, list := range objs {
		for _, o := range list {
			out = append(out, o.kind+"/"+o.name)
		}
	}
	slices.Sort(out)
	return out
}

func TestHelmChart(t *testing.T) {
	for _, c := range []struct {
		helmSetup
		want []string // the objects it renders
		// fullCheck runs checkKubernetes; the sidecar's ConfigMap and Secret on
		// their own are only decoded (no pod mounts them).
		fullCheck bool
		extra     func(t *testing.T, r *rendered) problems
	}{
		{
			helmSetup: helmSetup{name: "default values and the required ones", chart: thisChart, release: "delaybridge",
				values: []string{"-f", ciValues("default-values.yaml")}},
			want: []string{"ConfigMap/delaybridge-config", "Deployment/delaybridge", "PodDisruptionBudget/delaybridge",
				"Secret/delaybridge-secrets", "Service/delaybridge-admin"},
			fullCheck: true,
			extra:     checkAdminToken,
		},
		{
			helmSetup: helmSetup{name: "Redis Cluster, with the ServiceMonitor and the PrometheusRule", chart: thisChart, release: "orders",
				values: []string{"-f", ciValues("redis-cluster-values.yaml")}},
			want: []string{"ConfigMap/orders-delaybridge-config", "Deployment/orders-delaybridge", "PodDisruptionBudget/orders-delaybridge",
				"PrometheusRule/orders-delaybridge", "Secret/orders-delaybridge-secrets", "Service/orders-delaybridge-admin",
				"ServiceMonitor/orders-delaybridge"},
			fullCheck: true,
			extra: func(t *testing.T, r *rendered) problems {
				ps := checkRedisCluster(r)
				ps = append(ps, checkMonitoring(r, "orders-delaybridge")...)
				return ps
			},
		},
		{
			helmSetup: helmSetup{name: "the sidecar shape, the chart alone", chart: thisChart, release: "orders",
				values: []string{"-f", ciValues("sidecar-values.yaml")}},
			want: []string{"ConfigMap/orders-delaybridge-config", "Secret/orders-delaybridge-secrets"},
		},
		{
			helmSetup: helmSetup{name: "the sidecar shape, in the example application chart", chart: exampleApp, release: "orders",
				values: []string{"--set", "delaybridge.secret.env.REDIS_PASSWORD=replace-with-the-redis-password"}},
			want:      []string{"ConfigMap/orders-delaybridge-config", "Deployment/orders-orders-app", "Secret/orders-delaybridge-secrets"},
			fullCheck: true,
			extra:     checkSidecarApp,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := lintAndRender(t, c.helmSetup)
			r.report(t, c.helmSetup, r.ps)
			if got := kinds(r.objs, r.monitoring); !slices.Equal(got, c.want) {
				t.Errorf("helm template %s (%s) renders %q, want %q", c.release, c.name, got, c.want)
			}
			if c.fullCheck {
				r.report(t, c.helmSetup, checkKubernetes(r.dir))
			}
			if c.extra != nil {
				r.report(t, c.helmSetup, c.extra(t, r))
			}
		})
	}
}

// checkAdminToken: a Deployment whose admin API is on the pod IP gets a
// generated token when none is given.
func checkAdminToken(_ *testing.T, r *rendered) problems {
	var ps problems
	s, o := findObject[*corev1.Secret](r.objs, "delaybridge-secrets")
	if o == nil {
		return append(ps, "no Secret delaybridge-secrets")
	}
	if tok := s.StringData["DELAYBRIDGE_ADMIN_TOKEN"]; len(tok) < 32 {
		ps.add("%s: Secret %s: DELAYBRIDGE_ADMIN_TOKEN %q, want a generated token of 32 characters or more", o.file, o.name, tok)
	}
	return ps
}

// checkRedisCluster: the configuration the pods get is a Redis Cluster one.
func checkRedisCluster(r *rendered) problems {
	var ps problems
	cm, o := findObject[*corev1.ConfigMap](r.objs, "orders-delaybridge-config")
	if o == nil {
		return append(ps, "no ConfigMap orders-delaybridge-config")
	}
	var cfg struct {
		Redis struct {
			Cluster bool     `json:"cluster"`
			Addrs   []string `json:"addrs"`
			Addr    string   `json:"addr"`
		} `json:"redis"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		return append(ps, fmt.Sprintf("%s: %v", o.file, err))
	}
	if !cfg.Redis.Cluster || len(cfg.Redis.Addrs) != 3 || cfg.Redis.Addr != "" {
		ps.add("%s: data.config.yaml: redis is %+v, want cluster: true with the 3 addrs of ci/redis-cluster-values.yaml and no addr", o.file, cfg.Redis)
	}
	return ps
}

// checkMonitoring: the ServiceMonitor scrapes the admin Service's /metrics
// under the job the rules expect, and the PrometheusRule holds exactly the
// rules of deploy/prometheus with that job.
func checkMonitoring(r *rendered, job string) problems {
	var ps problems
	sm, smObj := findObject[*monitoringv1.ServiceMonitor](r.monitoring, job)
	if smObj == nil {
		return append(ps, "no ServiceMonitor "+job)
	}
	where := fmt.Sprintf("%s: ServiceMonitor %s", smObj.file, smObj.name)
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	var svc *corev1.Service
	for _, o := range r.objs {
		if s, ok := o.obj.(*corev1.Service); ok && err == nil && !sel.Empty() && sel.Matches(labels.Set(s.Labels)) {
			svc = s
		}
	}
	switch {
	case svc == nil:
		ps.add("%s: spec.selector %v selects no rendered Service (%v)", where, sm.Spec.Selector, err)
	case !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, helmNamespace):
		ps.add("%s: spec.namespaceSelector %v leaves out the release's namespace %s", where, sm.Spec.NamespaceSelector, helmNamespace)
	}
	if len(sm.Spec.Endpoints) != 1 {
		return append(ps, fmt.Sprintf("%s: %d endpoints, want 1", where, len(sm.Spec.Endpoints)))
	}
	ep := sm.Spec.Endpoints[0]
	if svc != nil && !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
		ps.add("%s: endpoints[0].port %q is no port name of Service %s", where, ep.Port, svc.Name)
	}
	if ep.Path != "/metrics" { // served only with the daemon's metrics, which adminGet's handler has not
		ps.add("%s: endpoints[0].path %q, want /metrics", where, ep.Path)
	}
	jobSet := false
	for _, rl := range ep.RelabelConfigs {
		if rl.TargetLabel == "job" && rl.Replacement != nil && *rl.Replacement == job && len(rl.SourceLabels) == 0 {
			jobSet = true
		}
	}
	if !jobSet {
		ps.add("%s: endpoints[0].relabelings do not set job=%q: the rules' instance alerts match up{job=%q}", where, job, job)
	}

	pr, prObj := findObject[*monitoringv1.PrometheusRule](r.monitoring, job)
	if prObj == nil {
		return append(ps, "no PrometheusRule "+job)
	}
	src, ok := readFile(&ps, rulesFile)
	if !ok {
		return ps
	}
	text := strings.ReplaceAll(string(src), `job="delaybridge"`, fmt.Sprintf("job=%q", job))
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict([]byte(text), &want); err != nil {
		return append(ps, fmt.Sprintf("%s: %v", rulesFile, err))
	}
	if len(want.Groups) == 0 || !reflect.DeepEqual(pr.Spec.Groups, want.Groups) {
		ps.add("%s: PrometheusRule %s: spec.groups are not the groups of %s with job=%q: %s", prObj.file, prObj.name, rulesFile, job, firstDifference(pr.Spec.Groups, want.Groups))
	}
	return ps
}

// firstDifference names the first rule group or rule where got and want differ.
func firstDifference(got, want []monitoringv1.RuleGroup) string {
	for i := 0; i < max(len(got), len(want)); i++ {
		switch {
		case i >= len(got):
			return fmt.Sprintf("group %q is missing", want[i].Name)
		case i >= len(want):
			return fmt.Sprintf("group %q is not in the file", got[i].Name)
		case reflect.DeepEqual(got[i], want[i]):
			continue
		}
		g, w := got[i], want[i]
		for j := 0; j < max(len(g.Rules), len(w.Rules)); j++ {
			if j >= len(g.Rules) || j >= len(w.Rules) || !reflect.DeepEqual(g.Rules[j], w.Rules[j]) {
				gj, _ := json.Marshal(g.Rules[min(j, len(g.Rules)-1)])
				wj, _ := json.Marshal(w.Rules[min(j, len(w.Rules)-1)])
				return fmt.Sprintf("group %q, rule %d: got %s, want %s", g.Name, j, gj, wj)
			}
		}
		return fmt.Sprintf("group %q differs outside its rules (name, interval...)", g.Name)
	}
	return "no groups"
}

// checkSidecarApp: the example application runs delaybridge as the native
// sidecar that checkKubernetes checks (checkSidecarOrder), and nothing of
// the standalone shape is rendered.
func checkSidecarApp(_ *testing.T, r *rendered) problems {
	var ps problems
	d, o := findObject[*appsv1.Deployment](r.objs, "orders-orders-app")
	if o == nil {
		return append(ps, "no Deployment orders-orders-app")
	}
	pod := d.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].Name != "delaybridge" || len(pod.Containers) != 1 {
		ps.add("%s: Deployment %s: want initContainers [delaybridge] and containers [app], got %d and %d", o.file, o.name, len(pod.InitContainers), len(pod.Containers))
	}
	if _, ok := d.Spec.Template.Annotations["checksum/delaybridge"]; !ok {
		ps.add("%s: Deployment %s: no checksum/delaybridge annotation: a configuration change would not roll the pods", o.file, o.name)
	}
	return ps
}

// TestHelmRulesCopy: the chart's rules are deploy/prometheus's, byte for byte
// (test/ops checks and unit-tests that file with promtool).
func TestHelmRulesCopy(t *testing.T) {
	src, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(chartDir, chartRulesFile)
	got, err := os.ReadFile(cp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, got) {
		t.Errorf("%s differs from %s: copy it (cp deploy/%s deploy/%s)", cp, rulesFile, rulesFile, cp)
	}
}

// TestHelmRefuses: a value the schema refuses makes both `helm lint` and
// `helm template` fail, with a message that names it. The rules a schema
// cannot say (they compare two values, or the Kubernetes version) are
// `fail` calls in the templates: `helm template` fails with their message,
// while `helm lint` renders in its lint mode, where a fail is only logged
// ("[INFO] Fail: ...") so that charts with required values can be linted.
func TestHelmRefuses(t *testing.T) {
	def := func(more ...string) []string {
		return slices.Concat([]string{"-f", ciValues("default-values.yaml")}, more)
	}
	sidecar := func(more ...string) []string {
		return slices.Concat([]string{"-f", ciValues("sidecar-values.yaml")}, more)
	}
	for _, c := range []struct {
		name       string
		values     []string
		kube       string // default helmKubeVersion
		byTemplate bool   // a template's fail, not the schema
		want       string
	}{
		{"an unknown top-level value", def("--set", "replicas=3"), "", false, "additional properties 'replicas' not allowed"},
		{"a misspelt configuration key", def("--set", "config.redis.adress=redis:6379"), "", false, "at '/config/redis': additional properties 'adress' not allowed"},
		{"a misspelt broker key", def("--set", "config.sinks[0].rabbitmq.exchnage=x"), "", false, "at '/config/sinks/0/rabbitmq': additional properties 'exchnage' not allowed"},
		{"a wrong type", def("--set", "config.redis.shards=sixteen"), "", false, "at '/config/redis/shards': got string, want integer"},
		{"a duration without unit", def("--set-string", "config.shutdown_timeout=20"), "", false, "at '/config/shutdown_timeout'"},
		{"no Redis address", nil, "", false, "at '/config/redis': missing property 'addr'"},
		{"no sink", []string{"--set", "config.redis.addr=redis:6379"}, "", false, "at '/config': missing property 'sinks'"},
		{"a Redis Cluster without addrs", def("--set", "config.redis.cluster=true", "--set", "config.redis.addr=null"), "", false, "at '/config/redis': missing property 'addrs'"},
		{"a Redis Cluster with addr", def("--set", "config.redis.cluster=true", "--set", "config.redis.addrs={r:6379}"), "", false, "at '/config/redis/addr': false schema"},
		{"a Kafka sink without brokers", []string{"--set", "config.redis.addr=redis:6379", "--set", "config.sinks[0].name=k", "--set", "config.sinks[0].kafka.compression=none"}, "", false, "at '/config/sinks/0/kafka': missing property 'brokers'"},
		{"a sink without a broker", []string{"--set", "config.redis.addr=redis:6379", "--set", "config.sinks[0].name=k"}, "", false, "at '/config/sinks/0': 'anyOf' failed"},
		{"a sink with two brokers", def("--set", "config.sinks[1].kafka.brokers={k:9092}"), "", false, "at '/config/sinks/1/nats': false schema"},
		{"an unknown Secret variable name", def("--set", "secret.env.BAD-NAME=x"), "", false, "at '/secret/env': additional properties 'BAD-NAME' not allowed"},
		{"an existing Secret without its name", def("--set", "secret.create=false"), "", false, "at '/secret': missing property 'name'"},
		{"admin.listen, which the chart sets", def("--set", "config.admin.listen=0.0.0.0:8080"), "", true, "config.admin.listen is set by the chart"},
		{"a grace period under the shutdown rule", def("--set", "terminationGracePeriodSeconds=24"), "", true, "terminationGracePeriodSeconds: 24 is less than config.shutdown_timeout (20s) + 5s"},
		{"a ServiceMonitor for the sidecar", sidecar("--set", "serviceMonitor.enabled=true"), "", true, "serviceMonitor.enabled: the sidecar's admin server is on the pod's loopback"},
		{"the sidecar before Kubernetes 1.29", sidecar(), "1.28.0", true, "sidecar.enabled: native sidecars (an init container with restartPolicy: Always) need Kubernetes 1.29 or later"},
	} {
		t.Run(c.name, func(t *testing.T) {
			kube := helmKubeVersion
			if c.kube != "" {
				kube = c.kube
			}
			for _, cmd := range [][]string{
				{"lint", "--strict", "--kube-version", kube, chartDir},
				{"template", "refused", chartDir, "--kube-version", kube},
			} {
				args := append(cmd, c.values...)
				out, err := runHelm(t, args...)
				lintMode := c.byTemplate && cmd[0] == "lint"
				switch {
				case lintMode && !strings.Contains(out, "Fail: "+c.want):
					t.Errorf("helm %s: the output does not report %q:\n%s", strings.Join(args, " "), c.want, out)
				case lintMode:
					t.Logf("helm lint reports it: %s", firstLineWith(out, c.want))
				case err == nil:
					t.Errorf("helm %s succeeded, want it to fail with %q", strings.Join(args, " "), c.want)
				case !strings.Contains(out, c.want):
					t.Errorf("helm %s fails, but its output does not say %q:\n%s", strings.Join(args, " "), c.want, out)
				default:
					t.Logf("helm %s fails as expected: %s", cmd[0], firstLineWith(out, c.want))
				}
			}
		})
	}
}

func firstLineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestHelmConfigExample: config.example.yaml, every key with its default,
// passes the chart's schema as config (less admin.listen, which the chart
// sets), and what the chart renders of it passes config.Parse.
func TestHelmConfigExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "config.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if admin, ok := cfg["admin"].(map[string]any); ok {
		delete(admin, "listen")
	}
	values, err := yaml.Marshal(map[string]any{"config": cfg})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "config-example-values.yaml")
	if err := os.WriteFile(file, values, 0o644); err != nil {
		t.Fatal(err)
	}
	s := helmSetup{name: "config.example.yaml as config", chart: thisChart, release: "delaybridge", values: []string{"-f", file}}
	r := lintAndRender(t, s)
	r.report(t, s, r.ps)
	r.report(t, s, checkKubernetes(r.dir))
}

// TestHelmSchemaKnowsTheConfigKeys: every object of the schema's config that
// refuses unknown keys lists exactly the keys delaybridge knows there, as
// delaybridge's own unknown-key message names them. A key added to the
// configuration must be added to helm/delaybridge/values.schema.json, and
// the schema lists no key that delaybridge would refuse.
func TestHelmSchemaKnowsTheConfigKeys(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := json.Unmarshal(data, &root); err != nil {
		t.Fatal(err)
	}
	config, _ := root["properties"].(map[string]any)["config"].(map[string]any)
	if config == nil {
		t.Fatal("values.schema.json has no properties.config")
	}
	closed := map[string][]string{} // config path -> the keys the schema allows
	walkSchema(t, root, config, func(node map[string]any, path []any) {
		if ap, ok := node["additionalProperties"].(bool); ok && !ap {
			props, _ := node["properties"].(map[string]any)
			closed[configPath(path)] = sortedKeys(props)
		}
	})
	if len(closed) < 10 {
		t.Fatalf("values.schema.json: only %d closed objects under config (%v): the walk is broken", len(closed), sortedKeys(closed))
	}

	const probe = "zz_unknown_key_probe"
	known := regexp.MustCompile(`^(.*): unknown key \(known keys here: (.*)\)$`)
	for _, p := range sortedKeys(closed) {
		doc, err := yaml.Marshal(probeConfig(pathOf(p), probe))
		if err != nil {
			t.Fatal(err)
		}
		_, problems := loadConfig(doc, map[string]string{})
		want := strings.TrimPrefix(p+"."+probe, ".")
		var daemon []string
		found := false
		for _, msg := range problems {
			if m := known.FindStringSubmatch(msg); m != nil && m[1] == want {
				daemon, found = strings.Split(m[2], ", "), true
			}
		}
		if !found {
			t.Errorf("values.schema.json: config%s refuses unknown keys, but delaybridge does not know that path: a key %s there is not refused as unknown (%q)", dotted(p), probe, problems)
			continue
		}
		schema := closed[p]
		if missing, extra := setDiff(daemon, schema), setDiff(schema, daemon); len(missing)+len(extra) > 0 {
			t.Errorf("values.schema.json: config%s: the schema lacks %q (delaybridge knows them: add them to its properties) and lists %q (delaybridge refuses them: remove them)", dotted(p), missing, extra)
		}
	}
}

// walkSchema calls visit for node (the schema's config) and every schema
// below it, with its config path ([ingest 0 kafka]), each $ref resolved in
// root's $defs.
func walkSchema(t *testing.T, root, node map[string]any, visit func(node map[string]any, path []any)) {
	var walk func(node map[string]any, path []any)
	walk = func(node map[string]any, path []any) {
		if ref, ok := node["$ref"].(string); ok {
			def, _ := root["$defs"].(map[string]any)[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
			if def == nil {
				t.Fatalf("values.schema.json: %s: $ref %s names no $defs entry", configPath(path), ref)
			}
			node = def
		}
		visit(node, path)
		props, _ := node["properties"].(map[string]any)
		for _, k := range sortedKeys(props) {
			if sub, ok := props[k].(map[string]any); ok {
				walk(sub, append(slices.Clone(path), k))
			}
		}
		if items, ok := node["items"].(map[string]any); ok {
			walk(items, append(slices.Clone(path), 0))
		}
	}
	walk(node, nil)
}

// configPath is "ingest[0].kafka" for [ingest 0 kafka].
func configPath(path []any) string {
	var b strings.Builder
	for _, e := range path {
		switch v := e.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(v)
		case int:
			fmt.Fprintf(&b, "[%d]", v)
		}
	}
	return b.String()
}

func dotted(p string) string {
	if p == "" {
		return ""
	}
	return "." + p
}

// pathOf parses configPath's output back.
func pathOf(p string) []any {
	var out []any
	for _, part := range strings.Split(p, ".") {
		if part == "" {
			continue
		}
		name, idx, _ := strings.Cut(part, "[")
		out = append(out, name)
		for idx != "" {
			out = append(out, 0) // only [0] is made
			_, idx, _ = strings.Cut(idx, "[")
		}
	}
	return out
}

// probeConfig is a configuration with key set at path.
func probeConfig(path []any, key string) any {
	if len(path) == 0 {
		return map[string]any{key: 1}
	}
	inner := probeConfig(path[1:], key)
	if _, ok := path[0].(int); ok {
		return []any{inner}
	}
	return map[string]any{path[0].(string): inner}
}

// setDiff is what of a is not in b.
func setDiff(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// TestHelmBrokenChart breaks one template of a copy of the chart at a time,
// and expects the checks on its rendering to catch it: they run on what the
// chart renders, not on a fixed expectation.
func TestHelmBrokenChart(t *testing.T) {
	for _, c := range []struct {
		name  string
		file  string // in the chart
		edits []edit
		app   bool // the sidecar example, not helm/delaybridge/ci/redis-cluster-values.yaml
		want  string
	}{
		{"a misspelt field", "templates/deployment.yaml", []edit{{"automountServiceAccountToken:", "automountServiceAccountTokn:"}}, false,
			`unknown field "spec.template.spec.automountServiceAccountTokn"`},
		{"readiness on /healthz", "templates/_helpers.tpl", []edit{{`"readiness" "/readyz"`, `"readiness" "/healthz"`}}, false,
			`readinessProbe.httpGet.path: "/healthz", want /readyz`},
		{"a writable root filesystem", "templates/_helpers.tpl", []edit{{"readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false"}}, false,
			"readOnlyRootFilesystem: want true"},
		{"a configuration key delaybridge does not know", "templates/_helpers.tpl", []edit{{`set $admin "listen"`, `set $admin "listn"`}}, false,
			"admin.listn: unknown key"},
		{"the Service to another port", "templates/service.yaml", []edit{{"targetPort: admin", "targetPort: metrics"}}, false,
			"targetPort metrics is no containerPort"},
		{"a misspelt ServiceMonitor field", "templates/servicemonitor.yaml", []edit{{"scrapeTimeout:", "scrapeTimout:"}}, false,
			`unknown field "spec.endpoints[0].scrapeTimout"`},
		{"rules unlike deploy/prometheus", chartRulesFile, []edit{{"alert: DelaybridgeFireLatenessHigh", "alert: DelaybridgeLate"}}, false,
			"spec.groups are not the groups of " + rulesFile},
		{"the sidecar as a plain init container", "templates/_helpers.tpl", []edit{{"  restartPolicy: Always\n", ""}}, true,
			"an init container without restartPolicy: Always never finishes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			broken := func(t *testing.T) string {
				dir := filepath.Join(t.TempDir(), chartName)
				copyTree(t, chartDir, dir)
				file := filepath.Join(dir, c.file)
				data, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				text := string(data)
				for _, e := range c.edits {
					if n := strings.Count(text, e.old); n != 1 {
						t.Fatalf("%s: %q occurs %d times, want once: update this case along with the chart", c.file, e.old, n)
					}
					text = strings.Replace(text, e.old, e.new, 1)
				}
				if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
				if !c.app {
					return dir
				}
				app := filepath.Join(t.TempDir(), "orders-app")
				copyApp(t, app)
				copyTree(t, dir, filepath.Join(app, "charts", chartName))
				return app
			}
			s := helmSetup{name: c.name, chart: broken, release: "orders", values: []string{"-f", ciValues("redis-cluster-values.yaml")}}
			if c.app {
				s.values = []string{"--set", "delaybridge.secret.env.REDIS_PASSWORD=x"}
			}
			r := lintAndRender(t, s)
			ps := slices.Concat(r.ps, checkKubernetes(r.dir))
			if !c.app {
				ps = append(ps, checkMonitoring(r, "orders-delaybridge")...)
			}
			for _, p := range ps {
				if strings.Contains(p, c.want) {
					t.Logf("fails as expected: %s", strings.ReplaceAll(p, r.dir+string(filepath.Separator), ""))
					return
				}
			}
			t.Errorf("%s broken (%s): no problem mentions %q; got %q", c.file, c.name, c.want, ps)
		})
	}
}

// readmeHelmMarker introduces the block of deploy/README.md that
// TestHelmREADMECommands runs.
const readmeHelmMarker = "<!-- deploy/helm_test.go (TestHelmREADMECommands) runs every line of the next block as printed -->"

// readmeHelmCommands returns the commands of the block after
// readmeHelmMarker in deploy/README.md, a line each (a line ending in "\\"
// continues on the next).
func readmeHelmCommands(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), readmeHelmMarker+"\n")
	if !ok {
		t.Fatalf("deploy/README.md has no line %q before the commands that check the charts", readmeHelmMarker)
	}
	block, ok := strings.CutPrefix(after, "```sh\n")
	if !ok {
		t.Fatal("deploy/README.md: the line after the marker of the Helm commands does not open a ```sh block")
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		t.Fatal("deploy/README.md: the block of the Helm commands does not end")
	}
	var cmds []string
	cont := ""
	for _, line := range strings.Split(block, "\n") {
		line = cont + strings.TrimSpace(line)
		cont = ""
		if l, ok := strings.CutSuffix(line, "\\"); ok {
			cont = l
			continue
		}
		if line != "" && !strings.HasPrefix(line, "#") {
			cmds = append(cmds, line)
		}
	}
	return cmds
}

// TestHelmREADMECommands runs the commands that deploy/README.md gives to
// check the charts without a cluster, as printed, from a copy of the
// repository's deploy/helm (helm dependency build writes into it), with the
// helm of make deps first on PATH: each must succeed.
// Every chart under deploy/helm must be linted and rendered there, each
// time with --kube-version: the helm here is stamped with Kubernetes 1.37,
// a plain `go install` assumes 1.20, and only the flag makes the two check
// the same.
func TestHelmREADMECommands(t *testing.T) {
	cmds := readmeHelmCommands(t)
	bin, err := helmBinary()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	copyTree(t, helmDir, filepath.Join(root, "deploy", helmDir))
	for _, built := range []string{"charts", "Chart.lock"} { // what a dependency build left in the checkout
		if err := os.RemoveAll(filepath.Join(root, "deploy", exampleAppDir, built)); err != nil {
			t.Fatal(err)
		}
	}
	env := append(helmEnv(t), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))

	var charts []string
	err = filepath.WalkDir(helmDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "Chart.yaml" && !strings.Contains(filepath.ToSlash(p), "/charts/") {
			charts = append(charts, filepath.ToSlash(filepath.Join("deploy", filepath.Dir(p))))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	linted, rendered := map[string]bool{}, map[string]bool{}
	for _, c := range cmds {
		f := strings.Fields(c)
		if len(f) < 3 || f[0] != "helm" {
			t.Errorf("deploy/README.md: %q is not a helm command: the block holds only the commands that check the charts", c)
			continue
		}
		switch f[1] {
		case "lint", "template":
			if !slices.Contains(f, "--kube-version") {
				t.Errorf("deploy/README.md: %q has no --kube-version: with a helm from a plain go install it checks against Kubernetes 1.20", c)
			}
			checked := rendered
			if f[1] == "lint" {
				checked = linted
			}
			for _, ch := range charts {
				if slices.Contains(f, ch) {
					checked[ch] = true
				}
			}
		}
		cmd := exec.Command("bash", "-c", c)
		cmd.Dir, cmd.Env = root, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("deploy/README.md: %s\nfails: %v\n%s", c, err, out)
			continue
		}
		t.Logf("%s: ok (%d bytes of output)", c, len(out))
	}
	if len(charts) < 2 {
		t.Fatalf("found %d charts under %s: %q", len(charts), helmDir, charts)
	}
	for _, ch := range charts {
		if !linted[ch] || !rendered[ch] {
			t.Errorf("deploy/README.md: the chart %s is not both linted and rendered (lint %v, template %v)", ch, linted[ch], rendered[ch])
		}
	}
}

// TestHelmSchemaBoundsAreTheConfigs: every minimum and maximum the schema
// states for a number under config is delaybridge's own: the bound itself
// draws no problem at that path, one past it does. A bound changed in the
// code and not in the schema (or the reverse) fails here.
func TestHelmSchemaBoundsAreTheConfigs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := json.Unmarshal(data, &root); err != nil {
		t.Fatal(err)
	}
	config, _ := root["properties"].(map[string]any)["config"].(map[string]any)
	type bound struct {
		path     []any
		min, max *float64
	}
	var bounds []bound
	walkSchema(t, root, config, func(node map[string]any, path []any) {
		b := bound{path: path}
		if v, ok := node["minimum"].(float64); ok {
			b.min = &v
		}
		if v, ok := node["maximum"].(float64); ok {
			b.max = &v
		}
		if b.min != nil || b.max != nil {
			bounds = append(bounds, b)
		}
	})
	if len(bounds) < 3 {
		t.Fatalf("values.schema.json: only %d bounds under config: the walk is broken", len(bounds))
	}
	// problemAt reports the problems delaybridge has with v at path.
	problemAt := func(path []any, v float64) []string {
		at, key := path[:len(path)-1], path[len(path)-1].(string)
		doc, err := yaml.Marshal(withValue(probeConfig(at, key), key, v))
		if err != nil {
			t.Fatal(err)
		}
		_, problems := loadConfig(doc, map[string]string{})
		name := configPath(path)
		var out []string
		for _, p := range problems {
			if strings.HasPrefix(p, name+":") || strings.HasPrefix(p, name+" ") || strings.Contains(p, "("+name+")") {
				out = append(out, p)
			}
		}
		return out
	}
	for _, b := range bounds {
		name := configPath(b.path)
		for _, edge := range []struct {
			at   *float64
			past float64
		}{{b.min, -1}, {b.max, 1}} {
			if edge.at == nil {
				continue
			}
			if p := problemAt(b.path, *edge.at); len(p) > 0 {
				t.Errorf("values.schema.json: config.%s allows %v, delaybridge refuses it: %q", name, *edge.at, p)
			}
			if past := *edge.at + edge.past; past == 0 && zeroIsDefault[name] {
				continue // 0 stands for the default, which the schema has no need to allow
			}
			if p := problemAt(b.path, *edge.at+edge.past); len(p) == 0 {
				t.Errorf("values.schema.json: config.%s refuses %v, delaybridge takes it: one of them has the bound wrong", name, *edge.at+edge.past)
			}
		}
	}
}

// zeroIsDefault are the numbers where delaybridge reads 0 as "the default"
// (pkg/config/config.go), which the schema refuses so that a values file says what it
// means.
var zeroIsDefault = map[string]bool{"redis.shards": true}

// withValue sets key to v wherever probeConfig put it.
func withValue(c any, key string, v float64) any {
	switch c := c.(type) {
	case map[string]any:
		if _, ok := c[key]; ok && len(c) == 1 {
			if _, leaf := c[key].(int); leaf {
				return map[string]any{key: v}
			}
		}
		out := map[string]any{}
		for k, sub := range c {
			out[k] = withValue(sub, key, v)
		}
		return out
	case []any:
		return []any{withValue(c[0], key, v)}
	}
	return c
}
