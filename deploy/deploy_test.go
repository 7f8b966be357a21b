// Tests that keep deploy/ from rotting. No Docker engine, cluster or systemd
// runs here, so the artifacts are parsed and cross-checked against the code:
//
//   - every configuration they carry (deploy/compose/config.yaml, the
//     ConfigMaps) passes config.Parse with exactly the environment that its
//     container gets (compose environment, the Secret through env/envFrom);
//   - every command line they run (Dockerfile ENTRYPOINT+CMD and
//     HEALTHCHECK, compose command, Kubernetes command/args and exec probes,
//     systemd ExecStart*) names a real subcommand and real flags of the
//     binary, as its --help (run in-process through cli.Main) lists them;
//   - the admin port of each configuration is the port that is exposed,
//     published and probed, and every probed path is a route of the real
//     admin handler that answers 200 without a token;
//   - the time a supervisor waits before SIGKILL (compose stop_grace_period,
//     terminationGracePeriodSeconds, TimeoutStopSec) covers a graceful stop;
//   - the image is built like `make build` (CGO_ENABLED=0, -trimpath, the
//     version ldflag, which is checked by building with it) and runs as a
//     numeric non-root user.
package deploy_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/cli"
	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
)

// Paths, relative to this package's directory (go test runs in it).
const (
	repoRoot       = ".."
	dockerfilePath = "Dockerfile"
	composePath    = "docker-compose.yml"
	kubernetesDir  = "kubernetes"
	systemdUnit    = "systemd/delaybridge.service"
	systemdEnv     = "systemd/delaybridge.env.example"
	binaryName     = "delaybridge"
	modulePath     = "github.com/delaybridge/delaybridge"
	versionSymbol  = modulePath + "/cmd/delaybridge/cli.version"
)

// stopMargin is how much longer than shutdown_timeout a supervisor must wait
// after its SIGTERM before it sends SIGKILL.
//
// daemon.Run stops within one shutdown_timeout: the ingests drain and the
// scheduler finishes its publishes at the same time, both within
// drainBudget (shutdown_timeout less at most 2 s), and the rest of the same
// budget goes to returning unparked messages, committing and closing. The
// fault suite asserts it (test/fault, sigterm-under-load and
// sigterm-redis-down: exit 0 within shutdown_timeout, 8.0 s of 10 s with
// Redis down). The margin covers what that budget does not bound: closing
// the sinks and the Redis client takes no context, the process still has to
// exit, and on a loaded node the supervisor's clock runs from its SIGTERM,
// before the daemon is scheduled. 5 s is more than twice the fixed reserve
// the daemon keeps for closing (2 s) and short enough that a hung process is
// still killed promptly.
const stopMargin = 5 * time.Second

// stopBudget is the least grace period a supervisor must give a
// configuration with this shutdown_timeout.
func stopBudget(shutdown time.Duration) time.Duration { return shutdown + stopMargin }

// ---------------------------------------------------------------------------
// Dockerfile

func TestDockerfile(t *testing.T) {
	df := loadDockerfile(t)
	if len(df.stages) < 2 {
		t.Fatalf("%s: want a multi-stage build (a Go builder, then a small final image), got %d stage(s)", dockerfilePath, len(df.stages))
	}

	t.Run("builder", func(t *testing.T) {
		build := df.stages[0]
		image, tag, _ := strings.Cut(build.from, ":")
		if image != "golang" && image != "docker.io/library/golang" {
			t.Errorf("%s:%d: first stage FROM %s: want golang:<version>", dockerfilePath, build.line, build.from)
		}
		if want := goModVersion(t); !goTagSatisfies(tag, want) {
			t.Errorf("%s:%d: builder golang:%s is older than go.mod's go %s (golang images set GOTOOLCHAIN=local, so the build would fail)", dockerfilePath, build.line, tag, want)
		}
		run := build.find("RUN", "go build")
		if run == nil {
			t.Fatalf("%s: the first stage has no RUN ... go build", dockerfilePath)
		}
		for _, want := range []string{
			"CGO_ENABLED=0", "-trimpath", "./cmd/delaybridge",
			"-X " + versionSymbol + "=",
			"--mount=type=cache,target=/go/pkg/mod",
			"--mount=type=cache,target=/root/.cache/go-build",
		} {
			if !strings.Contains(run.args, want) {
				t.Errorf("%s:%d: the go build RUN lacks %q", dockerfilePath, run.line, want)
			}
		}
	})

	final := df.stages[len(df.stages)-1]
	t.Run("final stage", func(t *testing.T) {
		if !(strings.HasPrefix(final.from, "gcr.io/distroless/static") && strings.HasSuffix(final.from, ":nonroot")) && final.from != "scratch" {
			t.Errorf("%s:%d: final FROM %s: want gcr.io/distroless/static*:nonroot or scratch (a static binary needs nothing else)", dockerfilePath, final.line, final.from)
		}
		user := final.last("USER")
		if user == nil {
			t.Fatalf("%s: the final stage sets no USER: it would run as root", dockerfilePath)
		}
		uid, _, _ := strings.Cut(user.args, ":")
		n, err := strconv.Atoi(uid)
		switch {
		case err != nil:
			t.Errorf("%s:%d: USER %s: want a numeric uid, so that Kubernetes' runAsNonRoot can verify it", dockerfilePath, user.line, user.args)
		case n == 0:
			t.Errorf("%s:%d: USER %s is root", dockerfilePath, user.line, user.args)
		}
		copied := false
		for _, in := range final.instrs {
			if in.cmd == "COPY" && strings.Contains(in.args, "--from=") {
				f := strings.Fields(in.args)
				if f[len(f)-1] == df.entrypoint[0] {
					copied = true
				}
			}
		}
		if !copied {
			t.Errorf("%s: ENTRYPOINT runs %s, but no COPY --from=... puts the binary there", dockerfilePath, df.entrypoint[0])
		}
		if s := final.last("STOPSIGNAL"); s != nil && s.args != "SIGTERM" && s.args != "15" {
			t.Errorf("%s:%d: STOPSIGNAL %s: delaybridge stops gracefully on SIGTERM", dockerfilePath, s.line, s.args)
		}
	})

	t.Run("entrypoint", func(t *testing.T) {
		inv := checkInvocation(t, dockerfilePath+": ENTRYPOINT+CMD", df.command(nil, nil))
		if inv.sub != "run" {
			t.Errorf("%s: ENTRYPOINT+CMD runs %q, want run", dockerfilePath, inv.sub)
		}
		cfg := inv.flags["config"]
		if cfg == "" {
			t.Errorf("%s: ENTRYPOINT+CMD gives no --config", dockerfilePath)
		}
		if env, ok := df.env["DELAYBRIDGE_CONFIG"]; ok && env != cfg {
			t.Errorf("%s: ENV DELAYBRIDGE_CONFIG=%s but CMD runs --config %s", dockerfilePath, env, cfg)
		}
	})

	t.Run("healthcheck", func(t *testing.T) {
		hc := final.last("HEALTHCHECK")
		if hc == nil {
			t.Fatalf("%s: no HEALTHCHECK (write HEALTHCHECK NONE, with the reason, if there is none)", dockerfilePath)
		}
		if hc.args == "NONE" {
			return
		}
		argv := df.healthcheck
		if argv == nil {
			t.Fatalf("%s:%d: HEALTHCHECK %s: want the exec form CMD [\"/usr/local/bin/delaybridge\", \"health\", ...] (distroless has no shell)", dockerfilePath, hc.line, hc.args)
		}
		where := dockerfilePath + ": HEALTHCHECK"
		inv := checkInvocation(t, where, argv)
		if inv.sub != "health" {
			t.Fatalf("%s runs %q, want health", where, inv.sub)
		}
		u := checkHealthURL(t, where, inv, "/healthz")
		if u != nil && !slices.Contains(df.expose, u.Port()) {
			t.Errorf("%s probes port %s, but the image EXPOSEs %v", where, u.Port(), df.expose)
		}
	})
}

// TestDockerfileVersionLdflag builds the binary with the Dockerfile's
// -ldflags and checks that `delaybridge version` prints the stamped version:
// it fails when the -X symbol no longer names the version variable.
func TestDockerfileVersionLdflag(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	df := loadDockerfile(t)
	run := df.stages[0].find("RUN", "go build")
	if run == nil {
		t.Fatalf("%s: no RUN ... go build", dockerfilePath)
	}
	m := regexp.MustCompile(`-ldflags\s+"([^"]*)"`).FindStringSubmatch(run.args)
	if m == nil {
		t.Fatalf("%s:%d: no -ldflags \"...\" in the go build RUN", dockerfilePath, run.line)
	}
	const stamp = "deploy-test-1.2.3"
	ldflags := regexp.MustCompile(`\$\{?VERSION\}?`).ReplaceAllString(m[1], stamp)
	bin := filepath.Join(t.TempDir(), binaryName)
	args := []string{"build", "-ldflags", ldflags, "-o", bin}
	// Built like the test binary itself (and like internal/testenv builds
	// it), so that the compiled packages come from the build cache and only
	// the link is new.
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	build := exec.Command("go", append(args, "./cmd/delaybridge")...)
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: go build -ldflags %q ./cmd/delaybridge: %v\n%s", dockerfilePath, ldflags, err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("delaybridge version: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); !strings.HasSuffix(got, stamp) {
		t.Errorf("%s: built with -ldflags %q, `delaybridge version` printed %q, want the version %q: does -X still name %s?", dockerfilePath, ldflags, got, stamp, versionSymbol)
	}
}

// TestDockerignore checks that deploy/Dockerfile.dockerignore keeps every
// file the image build reads: go.mod, go.sum, and the Go and embedded files
// of every package of this module that cmd/delaybridge is built from.
func TestDockerignore(t *testing.T) {
	ignorePath := dockerfilePath + ".dockerignore"
	data, err := os.ReadFile(ignorePath)
	if err != nil {
		t.Fatal(err)
	}
	ig := parseDockerignore(string(data))
	cmd := exec.Command("go", "list", "-deps", "-json=Dir,Module,GoFiles,EmbedFiles", "./cmd/delaybridge")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/delaybridge: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum"}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Dir                 string
			Module              *struct{ Path string }
			GoFiles, EmbedFiles []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || p.Module.Path != modulePath {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range append(p.GoFiles, p.EmbedFiles...) {
			needed = append(needed, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if len(needed) < 5 {
		t.Fatalf("go list found only %v: the check would prove nothing", needed)
	}
	for _, f := range needed {
		if ig.excludes(f) {
			t.Errorf("%s excludes %s, which the image build needs", ignorePath, f)
		}
	}
}

// ---------------------------------------------------------------------------
// docker-compose.yml

func TestCompose(t *testing.T) {
	df := loadDockerfile(t)
	data, err := os.ReadFile(composePath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]map[string]any `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", composePath, err)
	}
	services := doc.Services

	// Which services are delaybridge: those built from deploy/Dockerfile.
	var names []string
	for name, svc := range services {
		b, ok := svc["build"].(map[string]any)
		if !ok {
			continue
		}
		ctx, _ := b["context"].(string)
		file, _ := b["dockerfile"].(string)
		if file == "" {
			file = "Dockerfile"
		}
		got, err1 := filepath.Abs(filepath.Join(ctx, file))
		want, err2 := filepath.Abs(dockerfilePath)
		if err1 == nil && err2 == nil && got == want {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s: no service is built from deploy/Dockerfile (build.context + build.dockerfile)", composePath)
	}
	sort.Strings(names)

	mounted := map[string]bool{}
	for _, name := range names {
		svc := services[name]
		where := fmt.Sprintf("%s: services.%s", composePath, name)
		t.Run(name, func(t *testing.T) {
			argv := df.command(composeList(t, where+".entrypoint", svc["entrypoint"]), composeList(t, where+".command", svc["command"]))
			inv := checkInvocation(t, where+".command", argv)
			if inv.sub != "run" {
				t.Fatalf("%s runs %q, want run", where, inv.sub)
			}
			cfgPath := inv.flags["config"]
			if cfgPath == "" {
				t.Fatalf("%s: no --config in the command", where)
			}
			src := ""
			for _, v := range composeList(t, where+".volumes", svc["volumes"]) {
				parts := strings.Split(v, ":")
				if len(parts) >= 2 && parts[1] == cfgPath {
					src = parts[0]
				}
			}
			if src == "" {
				t.Fatalf("%s: no volume is mounted at --config %s", where, cfgPath)
			}
			mounted[filepath.Clean(src)] = true
			cfgData, err := os.ReadFile(src)
			if err != nil {
				t.Fatalf("%s.volumes: the configuration %s: %v", where, src, err)
			}
			env := composeEnv(t, where+".environment", svc["environment"])
			cfgWhere := fmt.Sprintf("%s (mounted by %s)", filepath.Clean(src), where)
			cfg := parseConfig(t, cfgWhere, cfgData, env)
			if cfg == nil {
				return
			}

			// The admin port: published, exposed, probed.
			host, port := adminListen(t, cfgWhere, cfg)
			if port != "" {
				published := false
				for _, p := range composeList(t, where+".ports", svc["ports"]) {
					parts := strings.Split(p, ":")
					if c, _, _ := strings.Cut(parts[len(parts)-1], "/"); c == port {
						published = true
					}
				}
				if !published {
					t.Errorf("%s.ports: admin.listen port %s of %s is not published", where, port, cfgWhere)
				} else if isLoopback(host) {
					t.Errorf("%s: admin.listen %s is the container's loopback: the published port %s reaches nothing (listen on 0.0.0.0 with a token)", cfgWhere, cfg.Admin.Listen, port)
				}
				if !slices.Contains(df.expose, port) {
					t.Errorf("%s: admin.listen port %s, but %s EXPOSEs %v", cfgWhere, port, dockerfilePath, df.expose)
				}
				checkComposeHealthcheck(t, where, svc, df, port)
			}

			if d := composeDuration(t, where+".stop_grace_period", svc["stop_grace_period"], 10*time.Second); d < stopBudget(cfg.ShutdownTimeout.D()) {
				t.Errorf("%s.stop_grace_period: %s (compose's default is 10s) is less than %s, shutdown_timeout %s of %s plus a margin: docker would SIGKILL a graceful stop",
					where, d, stopBudget(cfg.ShutdownTimeout.D()), cfg.ShutdownTimeout, cfgWhere)
			}

			// Dependencies: they exist, and their conditions can be met.
			deps := composeDependsOn(t, where, svc["depends_on"])
			for dep, cond := range deps {
				target, ok := services[dep]
				switch {
				case !ok:
					t.Errorf("%s.depends_on: no service %q", where, dep)
				case cond == "service_healthy" && !composeHasHealthcheck(target):
					t.Errorf("%s.depends_on.%s: condition service_healthy, but services.%s has no healthcheck", where, dep, dep)
				}
			}
			for host, field := range configHosts(cfg) {
				if _, ok := services[host]; !ok {
					t.Errorf("%s: %s names host %q, which is no service of %s", cfgWhere, field, host, composePath)
				} else if _, ok := deps[host]; !ok {
					t.Errorf("%s.depends_on: lacks %s, which %s (%s) connects to", where, host, cfgWhere, field)
				}
			}

			// What must exist on the brokers before delaybridge can deliver.
			commands := composeCommands(t, services)
			checkBrokerObjects(t, cfgWhere, cfg, commands)

			// Redis is the store of record.
			for _, dep := range sortedKeys(deps) {
				if !strings.HasPrefix(composeImage(services[dep]), "redis:") {
					continue
				}
				checkComposeRedis(t, fmt.Sprintf("%s: services.%s", composePath, dep), services[dep])
			}
		})
	}

	files, _ := filepath.Glob("compose/*.yaml")
	for _, f := range files {
		if !mounted[filepath.Clean(f)] {
			t.Errorf("%s is the --config of no service built from %s, so nothing here checks it", f, dockerfilePath)
		}
	}
}

func checkComposeHealthcheck(t *testing.T, where string, svc map[string]any, df *dockerfile, port string) {
	t.Helper()
	hc, ok := svc["healthcheck"].(map[string]any)
	if !ok {
		return // the image's HEALTHCHECK, checked by TestDockerfile against EXPOSE
	}
	test := composeList(t, where+".healthcheck.test", hc["test"])
	if len(test) == 0 || test[0] == "NONE" || hc["disable"] == true {
		return
	}
	if test[0] != "CMD" {
		t.Errorf("%s.healthcheck.test: %v: want [\"CMD\", \"/usr/local/bin/delaybridge\", \"health\", ...] (the image has no shell)", where, test)
		return
	}
	inv := checkInvocation(t, where+".healthcheck.test", test[1:])
	if u := checkHealthURL(t, where+".healthcheck.test", inv, "/healthz"); u != nil && u.Port() != port {
		t.Errorf("%s.healthcheck.test probes port %s, admin.listen's port is %s", where, u.Port(), port)
	}
}

func checkComposeRedis(t *testing.T, where string, svc map[string]any) {
	t.Helper()
	args := strings.Join(composeList(t, where+".command", svc["command"]), " ")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`--appendonly\s+"?yes`),
		regexp.MustCompile(`--appendfsync\s+"?(everysec|always)`),
		regexp.MustCompile(`--maxmemory-policy\s+"?noeviction`),
	} {
		if !want.MatchString(args) {
			t.Errorf("%s.command: %q does not match %s: Redis is delaybridge's store of record (AOF on, no eviction)", where, args, want)
		}
	}
	hasData := false
	for _, v := range composeList(t, where+".volumes", svc["volumes"]) {
		if parts := strings.Split(v, ":"); len(parts) >= 2 && parts[1] == "/data" {
			hasData = true
		}
	}
	if !hasData {
		t.Errorf("%s.volumes: nothing mounted at /data: the AOF would go with the container", where)
	}
}

// checkBrokerObjects checks that the topics, queues and streams that the
// configuration reads from or publishes to are created by some service's
// command (an init container), where delaybridge does not create them.
func checkBrokerObjects(t *testing.T, where string, cfg *config.Config, commands string) {
	t.Helper()
	sinks := map[string]config.Sink{}
	for _, s := range cfg.Sinks {
		sinks[s.Name] = s
	}
	rabbitIngestQueues := map[string]bool{}
	for _, in := range cfg.Ingest {
		if rabbitIn(in) != nil {
			rabbitIngestQueues[rabbitIn(in).Queue] = true // declared by delaybridge
		}
	}
	var subjects []string
	for _, m := range regexp.MustCompile(`--subjects[ =]'?"?([^'" ]+)`).FindAllStringSubmatch(commands, -1) {
		subjects = append(subjects, strings.Split(m[1], ",")...)
	}
	kafkaTopic := func(field, topic string) {
		if !regexp.MustCompile(`--topic[ =]"?` + regexp.QuoteMeta(topic) + `\b`).MatchString(commands) {
			t.Errorf("%s: %s: Kafka topic %q is created by no service's command (kafka-topics.sh --create --topic %s)", where, field, topic, topic)
		}
	}
	for i, in := range cfg.Ingest {
		at := fmt.Sprintf("ingest[%d]", i)
		if kafkaIn(in) != nil {
			kafkaTopic(at+".kafka.topic", kafkaIn(in).Topic)
		}
		s, dest := sinks[in.Route.Sink], in.Route.Destination
		field := at + ".route.destination"
		switch {
		case kafkaOut(s) != nil:
			kafkaTopic(field, dest)
		case rabbitOut(s) != nil && rabbitOut(s).Exchange == "":
			if !rabbitIngestQueues[dest] && !strings.Contains(commands, "name="+dest+" ") && !strings.HasSuffix(commands, "name="+dest) {
				t.Errorf("%s: %s: RabbitMQ queue %q (default exchange: routing key = queue) is declared by no service's command: publishes would be unroutable", where, field, dest)
			}
		case natsOut(s) != nil && natsOut(s).JetStream:
			if !slices.ContainsFunc(subjects, func(p string) bool { return natsSubjectMatch(p, dest) }) {
				t.Errorf("%s: %s: NATS subject %q is in no stream created by a service's command (--subjects ...): JetStream publishes would get no PubAck", where, field, dest)
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Kubernetes

func TestKubernetes(t *testing.T) {
	df := loadDockerfile(t)
	objs := loadKubernetes(t)

	t.Run("kustomization", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(kubernetesDir, "kustomization.yaml"))
		if err != nil {
			t.Skip("no kustomization.yaml")
		}
		var k struct {
			Resources []string `yaml:"resources"`
		}
		if err := yaml.Unmarshal(data, &k); err != nil {
			t.Fatalf("%s/kustomization.yaml: %v", kubernetesDir, err)
		}
		for _, r := range k.Resources {
			if _, err := os.Stat(filepath.Join(kubernetesDir, r)); err != nil {
				t.Errorf("%s/kustomization.yaml: resources: %v", kubernetesDir, err)
			}
		}
	})

	deployments := 0
	checkedConfigs := map[string]bool{} // "ConfigMap/key" parsed as a configuration
	for _, o := range objs {
		if o.Kind != "Deployment" {
			continue
		}
		var d k8sDeployment
		if err := o.node.Decode(&d); err != nil {
			t.Fatalf("%s: Deployment %s: %v", o.file, o.Metadata.Name, err)
		}
		pod := &d.Spec.Template.Spec
		checked := 0
		for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
			if !strings.Contains(c.Image, binaryName) {
				continue
			}
			checked++
			where := fmt.Sprintf("%s: Deployment %s: container %s", o.file, o.Metadata.Name, c.Name)
			t.Run(o.Metadata.Name+"/"+c.Name, func(t *testing.T) {
				isInit := slices.ContainsFunc(pod.InitContainers, func(ic k8sContainer) bool { return ic.Name == c.Name })
				checkKubernetesContainer(t, where, objs, df, pod, c, isInit, checkedConfigs)
			})
		}
		if checked == 0 {
			t.Errorf("%s: Deployment %s runs no %s image", o.file, o.Metadata.Name, binaryName)
		}
		deployments++
	}
	if deployments == 0 {
		t.Fatalf("%s: no Deployment", kubernetesDir)
	}
	for _, o := range objs {
		if o.Kind != "ConfigMap" {
			continue
		}
		var cm struct {
			Data map[string]string `yaml:"data"`
		}
		if err := o.node.Decode(&cm); err != nil {
			t.Fatalf("%s: ConfigMap %s: %v", o.file, o.Metadata.Name, err)
		}
		for _, key := range sortedKeys(cm.Data) {
			if !checkedConfigs[o.Metadata.Name+"/"+key] {
				t.Errorf("%s: ConfigMap %s: data.%s is the --config of no %s container, so nothing here checks it", o.file, o.Metadata.Name, key, binaryName)
			}
		}
	}

	for _, o := range objs {
		if o.Kind != "Service" {
			continue
		}
		t.Run("Service "+o.Metadata.Name, func(t *testing.T) {
			checkKubernetesService(t, objs, o)
		})
	}
}

func checkKubernetesContainer(t *testing.T, where string, objs []k8sObject, df *dockerfile, pod *k8sPodSpec, c k8sContainer, isInit bool, checked map[string]bool) {
	if isInit && c.RestartPolicy != "Always" {
		t.Errorf("%s: an init container without restartPolicy: Always never finishes, so the pod never starts: make it a native sidecar (restartPolicy: Always) or a container", where)
	}
	argv := df.command(c.Command, c.Args)
	inv := checkInvocation(t, where+": command/args", argv)
	if inv.sub != "run" {
		t.Fatalf("%s runs %q, want run", where, inv.sub)
	}
	cfgPath := inv.flags["config"]
	if cfgPath == "" {
		t.Fatalf("%s: args give no --config", where)
	}
	cmName, key := configMapMount(t, where, pod, c, cfgPath)
	if cmName == "" {
		return
	}
	cm := findObject(objs, "ConfigMap", cmName)
	if cm == nil {
		t.Fatalf("%s: volume for %s is ConfigMap %s, which is in no file of %s", where, cfgPath, cmName, kubernetesDir)
	}
	var cmDoc struct {
		Data map[string]string `yaml:"data"`
	}
	if err := cm.node.Decode(&cmDoc); err != nil {
		t.Fatalf("%s: ConfigMap %s: %v", cm.file, cmName, err)
	}
	text, ok := cmDoc.Data[key]
	if !ok {
		t.Fatalf("%s: ConfigMap %s has no data key %q, which %s mounts as %s", cm.file, cmName, key, where, cfgPath)
	}
	checked[cmName+"/"+key] = true
	env := kubernetesEnv(t, where, objs, c)
	cfgWhere := fmt.Sprintf("%s: ConfigMap %s: data.%s", cm.file, cmName, key)
	cfg := parseConfig(t, cfgWhere, []byte(text), env)
	if cfg == nil {
		return
	}

	host, port := adminListen(t, cfgWhere, cfg)
	if port == "" {
		t.Errorf("%s: admin.listen is empty: there is nothing to probe", cfgWhere)
		return
	}
	if !isLoopback(host) && cfg.Admin.Token == "" {
		t.Errorf("%s: admin.listen %s is reachable from the cluster but admin.token is empty: anyone could cancel or schedule messages", cfgWhere, cfg.Admin.Listen)
	}
	if !isLoopback(host) && !slices.ContainsFunc(c.Ports, func(p k8sPort) bool { return strconv.Itoa(p.ContainerPort) == port }) {
		t.Errorf("%s: ports: no containerPort %s (admin.listen %s of %s)", where, port, cfg.Admin.Listen, cfgWhere)
	}
	if !slices.Contains(df.expose, port) {
		t.Errorf("%s: admin.listen port %s, but %s EXPOSEs %v", cfgWhere, port, dockerfilePath, df.expose)
	}

	for _, p := range []struct {
		name, path string
		probe      *k8sProbe
		required   bool
	}{
		{"startupProbe", "/healthz", c.StartupProbe, false},
		{"livenessProbe", "/healthz", c.LivenessProbe, true},
		{"readinessProbe", "/readyz", c.ReadinessProbe, true},
	} {
		pw := where + ": " + p.name
		switch {
		case p.probe == nil:
			if p.required {
				t.Errorf("%s: missing", pw)
			}
		case p.probe.HTTPGet != nil:
			g := p.probe.HTTPGet
			if g.Path != p.path {
				t.Errorf("%s.httpGet.path: %q, want %s (liveness must not fail when a broker is down; readiness must)", pw, g.Path, p.path)
			}
			checkRoute(t, pw+".httpGet.path", g.Path)
			if got := resolvePort(c, g.Port.value); got != port {
				t.Errorf("%s.httpGet.port: %q is port %q, admin.listen of %s is port %s", pw, g.Port.value, got, cfgWhere, port)
			}
			if isLoopback(host) {
				t.Errorf("%s: httpGet comes from the kubelet to the pod IP, but admin.listen is %s: listen on 0.0.0.0 (with a token), or use an exec probe", pw, cfg.Admin.Listen)
			}
		case p.probe.Exec != nil:
			inv := checkInvocation(t, pw+".exec.command", p.probe.Exec.Command)
			if inv.sub != "health" {
				t.Errorf("%s.exec.command runs %q, want health", pw, inv.sub)
				continue
			}
			if u := checkHealthURL(t, pw+".exec.command", inv, p.path); u != nil && u.Port() != port {
				t.Errorf("%s.exec.command probes port %s, admin.listen of %s is port %s", pw, u.Port(), cfgWhere, port)
			}
		default:
			t.Errorf("%s: neither httpGet nor exec", pw)
		}
	}

	grace := 30 * time.Second // Kubernetes' default
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	if budget := stopBudget(cfg.ShutdownTimeout.D()); grace < budget {
		t.Errorf("%s: terminationGracePeriodSeconds %s is less than %s, shutdown_timeout %s of %s plus a margin: the kubelet would SIGKILL a graceful stop",
			where, grace, budget, cfg.ShutdownTimeout, cfgWhere)
	}

	// Security context: the container's settings, else the pod's.
	sc := c.SecurityContext
	if sc == nil {
		sc = &k8sSecurityContext{}
	}
	psc := pod.SecurityContext
	if psc == nil {
		psc = &k8sSecurityContext{}
	}
	nonRoot := firstBool(sc.RunAsNonRoot, psc.RunAsNonRoot)
	uid := sc.RunAsUser
	if uid == nil {
		uid = psc.RunAsUser
	}
	switch {
	case uid != nil && *uid == 0:
		t.Errorf("%s: runAsUser 0 is root", where)
	case !nonRoot && uid == nil:
		t.Errorf("%s: securityContext: set runAsNonRoot: true (pod or container)", where)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: securityContext.readOnlyRootFilesystem: want true (delaybridge writes no files)", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: securityContext.allowPrivilegeEscalation: want false", where)
	}

	// Resources, and GOMEMLIMIT under the memory limit.
	for _, r := range []struct {
		field string
		m     map[string]string
		key   string
	}{
		{"resources.requests.cpu", c.Resources.Requests, "cpu"},
		{"resources.requests.memory", c.Resources.Requests, "memory"},
		{"resources.limits.memory", c.Resources.Limits, "memory"},
	} {
		if r.m[r.key] == "" {
			t.Errorf("%s: %s is not set", where, r.field)
		}
	}
	if lim, gml := c.Resources.Limits["memory"], env["GOMEMLIMIT"]; lim != "" && gml != "" {
		l, err1 := parseBytes(lim)
		g, err2 := parseBytes(gml)
		switch {
		case err1 != nil || err2 != nil:
			t.Errorf("%s: cannot compare GOMEMLIMIT %q with resources.limits.memory %q: %v %v", where, gml, lim, err1, err2)
		case g >= l:
			t.Errorf("%s: GOMEMLIMIT %s is not below resources.limits.memory %s: the container would be killed before the GC works harder", where, gml, lim)
		}
	}
}

func checkKubernetesService(t *testing.T, objs []k8sObject, o k8sObject) {
	var svc struct {
		Spec struct {
			Selector map[string]string `yaml:"selector"`
			Ports    []struct {
				Name       string    `yaml:"name"`
				Port       int       `yaml:"port"`
				TargetPort intOrName `yaml:"targetPort"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	if err := o.node.Decode(&svc); err != nil {
		t.Fatalf("%s: Service %s: %v", o.file, o.Metadata.Name, err)
	}
	where := fmt.Sprintf("%s: Service %s", o.file, o.Metadata.Name)
	matched := false
	for _, d := range objs {
		if d.Kind != "Deployment" {
			continue
		}
		var dep k8sDeployment
		if err := d.node.Decode(&dep); err != nil {
			t.Fatal(err)
		}
		if len(svc.Spec.Selector) == 0 || !labelsMatch(svc.Spec.Selector, dep.Spec.Template.Metadata.Labels) {
			continue
		}
		matched = true
		for _, p := range svc.Spec.Ports {
			target := p.TargetPort.value
			if target == "" {
				target = strconv.Itoa(p.Port)
			}
			found := false
			for _, c := range dep.Spec.Template.Spec.Containers {
				resolved := resolvePort(c, target)
				if slices.ContainsFunc(c.Ports, func(cp k8sPort) bool { return strconv.Itoa(cp.ContainerPort) == resolved }) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: port %s: targetPort %q is no containerPort of Deployment %s", where, p.Name, target, d.Metadata.Name)
			}
		}
	}
	if !matched {
		t.Errorf("%s: selector %v selects the pods of no Deployment in %s", where, svc.Spec.Selector, kubernetesDir)
	}
}

// configMapMount finds the ConfigMap and key that a container sees at path.
func configMapMount(t *testing.T, where string, pod *k8sPodSpec, c k8sContainer, file string) (name, key string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		var rel string
		switch {
		case m.SubPath != "" && m.MountPath == file:
			rel = m.SubPath
		case m.SubPath == "" && strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/"):
			rel = strings.TrimPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		default:
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.ConfigMap == nil {
				t.Errorf("%s: volume %s (mounted at %s, holding --config %s) is not a ConfigMap", where, v.Name, m.MountPath, file)
				return "", ""
			}
			if len(v.ConfigMap.Items) == 0 {
				return v.ConfigMap.Name, rel
			}
			for _, it := range v.ConfigMap.Items {
				if it.Path == rel {
					return v.ConfigMap.Name, it.Key
				}
			}
			t.Errorf("%s: volume %s projects no item to %s (--config %s)", where, v.Name, rel, file)
			return "", ""
		}
		t.Errorf("%s: volumeMount %s names no volume of the pod", where, m.Name)
		return "", ""
	}
	t.Errorf("%s: no volumeMount holds --config %s", where, file)
	return "", ""
}

// kubernetesEnv is the environment a container gets from env and envFrom,
// with Secrets and ConfigMaps resolved from the files of deploy/kubernetes.
func kubernetesEnv(t *testing.T, where string, objs []k8sObject, c k8sContainer) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.SecretRef != nil:
			for k, v := range kubernetesData(t, where+": envFrom", objs, "Secret", ef.SecretRef.Name, ef.SecretRef.Optional) {
				env[ef.Prefix+k] = v
			}
		case ef.ConfigMapRef != nil:
			for k, v := range kubernetesData(t, where+": envFrom", objs, "ConfigMap", ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional) {
				env[ef.Prefix+k] = v
			}
		}
	}
	for _, e := range c.Env {
		var kind string
		var ref *k8sKeyRef
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
			continue
		case e.ValueFrom.SecretKeyRef != nil:
			kind, ref = "Secret", e.ValueFrom.SecretKeyRef
		case e.ValueFrom.ConfigMapKeyRef != nil:
			kind, ref = "ConfigMap", e.ValueFrom.ConfigMapKeyRef
		default:
			continue // fieldRef, resourceFieldRef: not known here
		}
		data := kubernetesData(t, where+": env "+e.Name, objs, kind, ref.Name, ref.Optional)
		if v, ok := data[ref.Key]; ok {
			env[e.Name] = v
		} else if data != nil && (ref.Optional == nil || !*ref.Optional) {
			t.Errorf("%s: env %s: %s %s has no key %s", where, e.Name, kind, ref.Name, ref.Key)
		}
	}
	return env
}

func kubernetesData(t *testing.T, where string, objs []k8sObject, kind, name string, optional *bool) map[string]string {
	t.Helper()
	o := findObject(objs, kind, name)
	if o == nil {
		if optional == nil || !*optional {
			t.Errorf("%s: %s %s is in no file of %s", where, kind, name, kubernetesDir)
		}
		return nil
	}
	var doc struct {
		Data       map[string]string `yaml:"data"`
		StringData map[string]string `yaml:"stringData"`
	}
	if err := o.node.Decode(&doc); err != nil {
		t.Fatalf("%s: %s %s: %v", o.file, kind, name, err)
	}
	out := map[string]string{}
	for k, v := range doc.Data {
		if kind == "Secret" {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				t.Errorf("%s: Secret %s: data.%s is not base64: %v", o.file, name, k, err)
			}
			v = string(b)
		}
		out[k] = v
	}
	for k, v := range doc.StringData {
		out[k] = v
	}
	return out
}

// ---------------------------------------------------------------------------
// systemd

func TestSystemd(t *testing.T) {
	unit := loadUnit(t, systemdUnit)
	get := func(key string) string {
		v := unit["Service."+key]
		if len(v) == 0 {
			return ""
		}
		return v[len(v)-1]
	}

	t.Run("commands", func(t *testing.T) {
		starts := unit["Service.ExecStart"]
		if len(starts) != 1 {
			t.Fatalf("%s: want one ExecStart, got %d", systemdUnit, len(starts))
		}
		for _, key := range []string{"ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop"} {
			for _, line := range unit["Service."+key] {
				where := fmt.Sprintf("%s: %s=%s", systemdUnit, key, line)
				argv := strings.Fields(strings.TrimLeft(line, "-@:+!"))
				if len(argv) == 0 || !filepath.IsAbs(argv[0]) {
					t.Errorf("%s: want an absolute path to the binary", where)
					continue
				}
				inv := checkInvocation(t, where, argv)
				if key == "ExecStart" && inv.sub != "run" {
					t.Errorf("%s: runs %q, want run", where, inv.sub)
				}
				if inv.sub == "run" || inv.sub == "validate" {
					if cfg := inv.flags["config"]; !filepath.IsAbs(cfg) {
						t.Errorf("%s: --config %q: want an absolute path", where, cfg)
					}
				}
			}
		}
	})

	t.Run("stop", func(t *testing.T) {
		if s := get("KillSignal"); s != "SIGTERM" && s != "" {
			t.Errorf("%s: KillSignal=%s: delaybridge stops gracefully on SIGTERM", systemdUnit, s)
		}
		raw := get("TimeoutStopSec")
		stop, err := parseSystemdSpan(raw)
		if raw == "" {
			raw, stop, err = "(unset: systemd's default, 90s)", 90*time.Second, nil
		}
		if err != nil {
			t.Fatalf("%s: TimeoutStopSec=%s: %v", systemdUnit, raw, err)
		}
		// The unit runs the operator's configuration: hold it to the
		// default shutdown_timeout and to config.example.yaml's.
		shutdowns := map[string]time.Duration{"the default shutdown_timeout": config.DefaultShutdownTimeout}
		if data, err := os.ReadFile(filepath.Join(repoRoot, "config.example.yaml")); err == nil {
			if cfg := parseConfig(t, "config.example.yaml (with "+systemdEnv+")", data, loadEnvFile(t, systemdEnv)); cfg != nil {
				shutdowns["config.example.yaml's shutdown_timeout"] = cfg.ShutdownTimeout.D()
			}
		}
		for what, s := range shutdowns {
			if stop < stopBudget(s) {
				t.Errorf("%s: TimeoutStopSec=%s is less than %s, %s %s plus a margin: systemd would SIGKILL a graceful stop", systemdUnit, raw, stopBudget(s), what, s)
			}
		}
	})

	t.Run("hardening", func(t *testing.T) {
		for key, want := range map[string][]string{
			"Restart":         {"on-failure", "always"},
			"NoNewPrivileges": {"yes", "true"},
			"ProtectSystem":   {"strict"},
		} {
			if got := get(key); !slices.Contains(want, got) {
				t.Errorf("%s: %s=%q, want one of %v", systemdUnit, key, got, want)
			}
		}
		if dyn, user := get("DynamicUser"), get("User"); dyn != "yes" && dyn != "true" && (user == "" || user == "root" || user == "0") {
			t.Errorf("%s: runs as root: set DynamicUser=yes or User= an unprivileged user", systemdUnit)
		}
		if len(unit["Service.EnvironmentFile"]) == 0 {
			t.Errorf("%s: no EnvironmentFile: the secrets of ${VAR} would have to be in the configuration", systemdUnit)
		}
	})
}

// ---------------------------------------------------------------------------
// The binary's command line, from its --help.

type cliFlag struct {
	long  string
	value bool // takes a value
}

type cliCommand struct {
	flags       map[string]cliFlag // by "--long" and "-s"
	positionals bool               // Usage names arguments besides flags
}

var (
	helpMu    sync.Mutex
	helpCache = map[string]*cliCommand{}
	rootSubs  map[string]bool
)

var (
	flagLine  = regexp.MustCompile(`^\s+(?:-([A-Za-z0-9]), )?--([A-Za-z0-9][A-Za-z0-9-]*)(?: ([A-Za-z0-9]+))?\s{2,}`)
	subLine   = regexp.MustCompile(`^  ([a-z][a-z0-9-]*)\s{2,}`)
	usageArgs = regexp.MustCompile(`\[[^\]]*\](\.\.\.)?|--[a-z-]+(\s+[A-Z][A-Z=]*)?`)
)

// help runs `delaybridge [sub] --help` in-process and parses it.
func help(t *testing.T, sub string) *cliCommand {
	t.Helper()
	helpMu.Lock()
	defer helpMu.Unlock()
	if c, ok := helpCache[sub]; ok {
		return c
	}
	args := []string{"--help"}
	if sub != "" {
		args = []string{sub, "--help"}
	}
	var out bytes.Buffer
	if code := cli.Main(args, strings.NewReader(""), &out, &out); code != 0 {
		t.Fatalf("delaybridge %s: exit %d\n%s", strings.Join(args, " "), code, out.String())
	}
	c := &cliCommand{flags: map[string]cliFlag{}}
	section := ""
	subs := map[string]bool{}
	lines := strings.Split(out.String(), "\n")
	for i, line := range lines {
		if strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " ") {
			section = line
			if section == "Usage:" && i+1 < len(lines) && sub != "" {
				u := strings.TrimSpace(lines[i+1])
				u = strings.TrimSpace(strings.TrimPrefix(u, binaryName+" "+sub))
				c.positionals = strings.TrimSpace(usageArgs.ReplaceAllString(u, "")) != ""
			}
			continue
		}
		switch section {
		case "Flags:", "Global Flags:":
			if m := flagLine.FindStringSubmatch(line); m != nil {
				f := cliFlag{long: m[2], value: m[3] != ""}
				c.flags["--"+m[2]] = f
				if m[1] != "" {
					c.flags["-"+m[1]] = f
				}
			}
		case "Available Commands:":
			if m := subLine.FindStringSubmatch(line); m != nil {
				subs[m[1]] = true
			}
		}
	}
	if sub == "" {
		rootSubs = subs
	}
	helpCache[sub] = c
	return c
}

type invocation struct {
	sub         string
	flags       map[string]string // by long name
	positionals []string
}

// checkInvocation checks that argv runs a real subcommand of delaybridge
// with real flags, each valued flag with a value, and no arguments where the
// subcommand takes none; it reports every problem with where.
func checkInvocation(t *testing.T, where string, argv []string) invocation {
	t.Helper()
	inv := invocation{flags: map[string]string{}}
	if len(argv) == 0 {
		t.Errorf("%s: empty command", where)
		return inv
	}
	if path.Base(argv[0]) != binaryName {
		t.Errorf("%s: runs %s, not the %s binary", where, argv[0], binaryName)
		return inv
	}
	root := help(t, "")
	args := argv[1:]
	// Global flags may come before the subcommand.
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		name, _, hasValue := strings.Cut(args[i], "=")
		f, ok := root.flags[name]
		if !ok {
			t.Errorf("%s: %s is no flag of %s (see %s --help)", where, name, binaryName, binaryName)
			return inv
		}
		if f.value && !hasValue {
			i++
		}
	}
	if i >= len(args) {
		t.Errorf("%s: %v names no subcommand", where, argv)
		return inv
	}
	inv.sub = args[i]
	if !rootSubs[inv.sub] || inv.sub == "help" || inv.sub == "completion" {
		t.Errorf("%s: %q is no subcommand of %s (it has: %s)", where, inv.sub, binaryName, strings.Join(sortedKeys(rootSubs), ", "))
		return inv
	}
	cmd := help(t, inv.sub)
	rest := append(slices.Clone(args[:i]), args[i+1:]...)
	for j := 0; j < len(rest); j++ {
		tok := rest[j]
		if tok == "--" {
			inv.positionals = append(inv.positionals, rest[j+1:]...)
			break
		}
		if !strings.HasPrefix(tok, "-") || tok == "-" {
			inv.positionals = append(inv.positionals, tok)
			continue
		}
		name, value, hasValue := strings.Cut(tok, "=")
		f, ok := cmd.flags[name]
		if !ok {
			t.Errorf("%s: %s is no flag of `%s %s` (see %s %s --help)", where, name, binaryName, inv.sub, binaryName, inv.sub)
			continue
		}
		if f.value && !hasValue {
			if j+1 >= len(rest) {
				t.Errorf("%s: %s needs a value", where, name)
				continue
			}
			j++
			value = rest[j]
		}
		inv.flags[f.long] = value
	}
	if len(inv.positionals) > 0 && !cmd.positionals {
		t.Errorf("%s: `%s %s` takes no arguments, got %q", where, binaryName, inv.sub, inv.positionals)
	}
	return inv
}

// checkHealthURL checks the --url of a `delaybridge health` invocation: a
// loopback http URL whose path is wantPath, a real route.
func checkHealthURL(t *testing.T, where string, inv invocation, wantPath string) *url.URL {
	t.Helper()
	raw := inv.flags["url"]
	if raw == "" {
		t.Errorf("%s: `delaybridge health` without --url derives it from admin.listen, which is 0.0.0.0 or [::] in a container: give --url http://127.0.0.1:PORT%s", where, wantPath)
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Port() == "" {
		t.Errorf("%s: --url %q: want http://127.0.0.1:PORT%s", where, raw, wantPath)
		return nil
	}
	if !isLoopback(u.Hostname()) {
		t.Errorf("%s: --url %q: the probe runs beside the daemon, use 127.0.0.1", where, raw)
	}
	if u.Path != wantPath {
		t.Errorf("%s: --url %q probes %s, want %s", where, raw, u.Path, wantPath)
	}
	checkRoute(t, where+": --url", u.Path)
	return u
}

// checkRoute checks that GET path answers 200 on the real admin handler,
// without a token even though one is configured.
func checkRoute(t *testing.T, where, p string) {
	t.Helper()
	h := admin.New(admin.Params{Token: "deploy-test-token"}).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
	if rec.Code != http.StatusOK {
		t.Errorf("%s: GET %s on the admin server answers %d, want 200 (probes send no token): %s", where, p, rec.Code, strings.TrimSpace(rec.Body.String()))
	}
}

// ---------------------------------------------------------------------------
// Configuration

// parseConfig runs config.Parse with exactly env as the environment (not
// the test's own) and reports every problem with where.
func parseConfig(t *testing.T, where string, data []byte, env map[string]string) *config.Config {
	t.Helper()
	cfg, err := config.Parse(data, func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	if err != nil {
		var ps config.Problems
		if errors.As(err, &ps) {
			for _, p := range ps {
				t.Errorf("%s: config.Parse with the environment %v: %s", where, sortedKeys(env), p)
			}
		} else {
			t.Errorf("%s: config.Parse: %v", where, err)
		}
		return nil
	}
	return cfg
}

func adminListen(t *testing.T, where string, cfg *config.Config) (host, port string) {
	t.Helper()
	if cfg.Admin.Listen == "" {
		return "", ""
	}
	host, port, err := net.SplitHostPort(cfg.Admin.Listen)
	if err != nil {
		t.Errorf("%s: admin.listen: %v", where, err)
	}
	return host, port
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// configHosts maps every broker and Redis host of cfg to a field naming it.
func configHosts(cfg *config.Config) map[string]string {
	hosts := map[string]string{}
	hostPort := func(field, addr string) {
		if h, _, err := net.SplitHostPort(addr); err == nil {
			hosts[h] = field
		}
	}
	urls := func(field, list string) {
		for _, one := range strings.Split(list, ",") {
			if u, err := url.Parse(strings.TrimSpace(one)); err == nil && u.Hostname() != "" {
				hosts[u.Hostname()] = field
			}
		}
	}
	hostPort("redis.addr", cfg.Redis.Addr)
	for i, a := range cfg.Redis.Addrs {
		hostPort(fmt.Sprintf("redis.addrs[%d]", i), a)
	}
	for i, in := range cfg.Ingest {
		at := fmt.Sprintf("ingest[%d]", i)
		switch {
		case kafkaIn(in) != nil:
			for j, b := range kafkaIn(in).Brokers {
				hostPort(fmt.Sprintf("%s.kafka.brokers[%d]", at, j), b)
			}
		case rabbitIn(in) != nil:
			urls(at+".rabbitmq.url", rabbitIn(in).URL)
		case natsIn(in) != nil:
			urls(at+".nats.url", natsIn(in).URL)
		}
	}
	for i, s := range cfg.Sinks {
		at := fmt.Sprintf("sinks[%d]", i)
		switch {
		case kafkaOut(s) != nil:
			for j, b := range kafkaOut(s).Brokers {
				hostPort(fmt.Sprintf("%s.kafka.brokers[%d]", at, j), b)
			}
		case rabbitOut(s) != nil:
			urls(at+".rabbitmq.url", rabbitOut(s).URL)
		case natsOut(s) != nil:
			urls(at+".nats.url", natsOut(s).URL)
		}
	}
	return hosts
}

// natsSubjectMatch reports whether subject is matched by the NATS subject
// filter pattern (tokens split by '.', '*' one token, '>' the rest).
func natsSubjectMatch(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

// ---------------------------------------------------------------------------
// Dockerfile parsing

type dockerInstr struct {
	cmd  string // upper case
	args string
	line int
}

type dockerStage struct {
	from   string
	name   string
	line   int
	instrs []dockerInstr
}

func (s *dockerStage) find(cmd, contains string) *dockerInstr {
	for i := range s.instrs {
		if s.instrs[i].cmd == cmd && strings.Contains(s.instrs[i].args, contains) {
			return &s.instrs[i]
		}
	}
	return nil
}

func (s *dockerStage) last(cmd string) *dockerInstr {
	for i := len(s.instrs) - 1; i >= 0; i-- {
		if s.instrs[i].cmd == cmd {
			return &s.instrs[i]
		}
	}
	return nil
}

type dockerfile struct {
	stages      []dockerStage
	entrypoint  []string // the final stage's, exec form
	cmd         []string
	healthcheck []string // HEALTHCHECK CMD, exec form; nil for NONE or shell form
	expose      []string
	env         map[string]string
}

// command is what a container of the image runs with an entrypoint and a
// command override (nil: none), with Docker's and Kubernetes' rules: an
// entrypoint override drops the image's CMD.
func (d *dockerfile) command(entrypoint, cmd []string) []string {
	ep, c := d.entrypoint, d.cmd
	if entrypoint != nil {
		ep, c = entrypoint, nil
	}
	if cmd != nil {
		c = cmd
	}
	return append(slices.Clone(ep), c...)
}

func loadDockerfile(t *testing.T) *dockerfile {
	t.Helper()
	data, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatal(err)
	}
	d := &dockerfile{env: map[string]string{}}
	args := map[string]string{} // ARGs before the first FROM
	var cur *dockerStage
	var logical strings.Builder
	start := 0
	lines := strings.Split(string(data), "\n")
	for i, raw := range lines {
		line := strings.TrimSpace(raw)
		if strings.HasPrefix(line, "#") || (line == "" && logical.Len() == 0) {
			continue
		}
		if logical.Len() == 0 {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			logical.WriteString(cont + " ")
			continue
		}
		logical.WriteString(line)
		text := strings.TrimSpace(logical.String())
		logical.Reset()
		cmd, rest, _ := strings.Cut(text, " ")
		in := dockerInstr{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(rest), line: start}
		switch in.cmd {
		case "ARG":
			if cur == nil {
				k, v, _ := strings.Cut(in.args, "=")
				args[k] = v
			}
		case "FROM":
			f := strings.Fields(in.args)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") })
			st := dockerStage{from: os.Expand(f[0], func(k string) string { return args[k] }), line: start}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			d.stages = append(d.stages, st)
			cur = &d.stages[len(d.stages)-1]
			continue
		}
		if cur == nil {
			continue
		}
		cur.instrs = append(cur.instrs, in)
	}
	if len(d.stages) == 0 {
		t.Fatalf("%s: no FROM", dockerfilePath)
	}
	final := &d.stages[len(d.stages)-1]
	execForm := func(in *dockerInstr, s string) []string {
		var v []string
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			t.Errorf("%s:%d: %s %s: want the exec form [\"...\"] (distroless has no shell): %v", dockerfilePath, in.line, in.cmd, s, err)
		}
		return v
	}
	if in := final.last("ENTRYPOINT"); in != nil {
		d.entrypoint = execForm(in, in.args)
	}
	if in := final.last("CMD"); in != nil {
		d.cmd = execForm(in, in.args)
	}
	if len(d.entrypoint) == 0 {
		t.Fatalf("%s: the final stage has no ENTRYPOINT", dockerfilePath)
	}
	if in := final.last("HEALTHCHECK"); in != nil && in.args != "NONE" {
		if _, after, ok := strings.Cut(in.args, "CMD "); ok {
			if s := strings.TrimSpace(after); strings.HasPrefix(s, "[") {
				d.healthcheck = execForm(in, s)
			}
		}
	}
	for _, in := range final.instrs {
		switch in.cmd {
		case "EXPOSE":
			for _, p := range strings.Fields(in.args) {
				p, _, _ = strings.Cut(p, "/")
				d.expose = append(d.expose, p)
			}
		case "ENV":
			k, v, _ := strings.Cut(in.args, "=")
			d.env[k] = v
		}
	}
	return d
}

// goModVersion is go.mod's go line.
func goModVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go\s+(\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod: no go line")
	}
	return string(m[1])
}

// goTagSatisfies reports whether a golang image tag ("1.26", "1.26.8",
// "1.26-bookworm") provides at least Go version want. A tag without a patch
// version floats to the newest patch release.
func goTagSatisfies(tag, want string) bool {
	tag, _, _ = strings.Cut(tag, "-")
	tv, wv := strings.Split(tag, "."), strings.Split(want, ".")
	for i := range tv {
		if i >= len(wv) {
			return true
		}
		a, err1 := strconv.Atoi(tv[i])
		b, err2 := strconv.Atoi(wv[i])
		if err1 != nil || err2 != nil {
			return false
		}
		if a != b {
			return a > b
		}
	}
	return true
}

// dockerignore is a .dockerignore's patterns; the last match wins.
type dockerignore []struct {
	re     *regexp.Regexp
	negate bool
}

func parseDockerignore(text string) dockerignore {
	var ig dockerignore
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		neg := strings.HasPrefix(line, "!")
		line = strings.Trim(strings.TrimPrefix(line, "!"), "/")
		var re strings.Builder
		for i := 0; i < len(line); i++ {
			switch {
			case strings.HasPrefix(line[i:], "**/"):
				re.WriteString(`(.*/)?`)
				i += 2
			case strings.HasPrefix(line[i:], "**"):
				re.WriteString(`.*`)
				i++
			case line[i] == '*':
				re.WriteString(`[^/]*`)
			case line[i] == '?':
				re.WriteString(`[^/]`)
			default:
				re.WriteString(regexp.QuoteMeta(line[i : i+1]))
			}
		}
		// A pattern that matches a directory excludes what is under it.
		ig = append(ig, struct {
			re     *regexp.Regexp
			negate bool
		}{regexp.MustCompile(`^` + re.String() + `(/.*)?$`), neg})
	}
	return ig
}

func (ig dockerignore) excludes(p string) bool {
	out := false
	for _, pat := range ig {
		if pat.re.MatchString(p) {
			out = !pat.negate
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Compose helpers

// composeInterpolate applies compose's ${VAR:-default} with an empty host
// environment, so that the files are checked as they run out of the box.
func composeInterpolate(t *testing.T, where, s string) string {
	t.Helper()
	re := regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}`)
	return re.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		sub := re.FindStringSubmatch(m)
		switch sub[2] {
		case ":-", "-":
			return sub[3]
		default:
			t.Errorf("%s: %s has no default: the stack would not start without it in the environment", where, m)
			return ""
		}
	})
}

// composeList reads a compose value that is a list or a string (split on
// white space), interpolated.
func composeList(t *testing.T, where string, v any) []string {
	t.Helper()
	switch v := v.(type) {
	case nil:
		return nil
	case string:
		return strings.Fields(composeInterpolate(t, where, v))
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			switch e := e.(type) {
			case string:
				out = append(out, composeInterpolate(t, where, e))
			case map[string]any: // long syntax (ports, volumes)
				src, _ := e["source"].(string)
				tgt := fmt.Sprint(e["target"])
				if src != "" {
					out = append(out, src+":"+tgt)
				} else {
					out = append(out, tgt)
				}
			default:
				out = append(out, fmt.Sprint(e))
			}
		}
		return out
	}
	t.Errorf("%s: unexpected %T", where, v)
	return nil
}

func composeEnv(t *testing.T, where string, v any) map[string]string {
	t.Helper()
	env := map[string]string{}
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if e == nil {
				continue // passed through from the host: unknown here
			}
			env[k] = composeInterpolate(t, where+"."+k, fmt.Sprint(e))
		}
	case []any:
		for _, e := range v {
			k, val, ok := strings.Cut(fmt.Sprint(e), "=")
			if ok {
				env[k] = composeInterpolate(t, where+"."+k, val)
			}
		}
	}
	return env
}

func composeDependsOn(t *testing.T, where string, v any) map[string]string {
	t.Helper()
	deps := map[string]string{}
	switch v := v.(type) {
	case []any:
		for _, d := range v {
			deps[fmt.Sprint(d)] = "service_started"
		}
	case map[string]any:
		for name, c := range v {
			cond := "service_started"
			if m, ok := c.(map[string]any); ok {
				if s, ok := m["condition"].(string); ok {
					cond = s
				}
			}
			deps[name] = cond
		}
	case nil:
	default:
		t.Errorf("%s.depends_on: unexpected %T", where, v)
	}
	return deps
}

func composeHasHealthcheck(svc map[string]any) bool {
	hc, ok := svc["healthcheck"].(map[string]any)
	if !ok || hc["disable"] == true {
		return false
	}
	switch test := hc["test"].(type) {
	case string:
		return test != "" && test != "NONE"
	case []any:
		return len(test) > 0 && test[0] != "NONE"
	}
	return false
}

func composeDuration(t *testing.T, where string, v any, def time.Duration) time.Duration {
	t.Helper()
	if v == nil {
		return def
	}
	d, err := time.ParseDuration(strings.ReplaceAll(fmt.Sprint(v), " ", ""))
	if err != nil {
		t.Errorf("%s: %v", where, err)
	}
	return d
}

func composeImage(svc map[string]any) string {
	s, _ := svc["image"].(string)
	return s
}

// composeCommands is every service's entrypoint and command, joined.
func composeCommands(t *testing.T, services map[string]map[string]any) string {
	t.Helper()
	var b strings.Builder
	for _, name := range sortedKeys(services) {
		for _, key := range []string{"entrypoint", "command"} {
			b.WriteString(strings.Join(composeList(t, name+"."+key, services[name][key]), " "))
			b.WriteString("\n")
		}
	}
	return b.String()
}

// ---------------------------------------------------------------------------
// Kubernetes types: only the fields checked here.

type k8sObject struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	node *yaml.Node
}

type k8sDeployment struct {
	Spec struct {
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec k8sPodSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds *int64              `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               *k8sSecurityContext `yaml:"securityContext"`
	InitContainers                []k8sContainer      `yaml:"initContainers"`
	Containers                    []k8sContainer      `yaml:"containers"`
	Volumes                       []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name  string `yaml:"name"`
			Items []struct {
				Key  string `yaml:"key"`
				Path string `yaml:"path"`
			} `yaml:"items"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type k8sContainer struct {
	Name          string   `yaml:"name"`
	Image         string   `yaml:"image"`
	Command       []string `yaml:"command"`
	Args          []string `yaml:"args"`
	RestartPolicy string   `yaml:"restartPolicy"`
	Env           []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef    *k8sKeyRef `yaml:"secretKeyRef"`
			ConfigMapKeyRef *k8sKeyRef `yaml:"configMapKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		Prefix       string     `yaml:"prefix"`
		SecretRef    *k8sKeyRef `yaml:"secretRef"`
		ConfigMapRef *k8sKeyRef `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Ports          []k8sPort `yaml:"ports"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *k8sSecurityContext `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

type k8sKeyRef struct {
	Name     string `yaml:"name"`
	Key      string `yaml:"key"`
	Optional *bool  `yaml:"optional"`
}

type k8sPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port intOrName `yaml:"port"`
	} `yaml:"httpGet"`
	Exec *struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
}

type k8sSecurityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
}

// intOrName is a port given as a number or a name.
type intOrName struct{ value string }

func (p *intOrName) UnmarshalYAML(n *yaml.Node) error {
	p.value = n.Value
	return nil
}

// resolvePort turns a port name of c into its number; a number stays.
func resolvePort(c k8sContainer, port string) string {
	for _, p := range c.Ports {
		if p.Name != "" && p.Name == port {
			return strconv.Itoa(p.ContainerPort)
		}
	}
	return port
}

func loadKubernetes(t *testing.T) []k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no *.yaml (%v)", kubernetesDir, err)
	}
	var objs []k8sObject
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for i := 0; ; i++ {
			var n yaml.Node
			if err := dec.Decode(&n); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: document %d: %v", f, i+1, err)
			}
			if len(n.Content) == 0 {
				continue // an empty document
			}
			o := k8sObject{file: f, node: &n}
			if err := n.Decode(&o); err != nil {
				t.Fatalf("%s: document %d: %v", f, i+1, err)
			}
			if o.Kind == "" {
				t.Errorf("%s: document %d has no kind", f, i+1)
				continue
			}
			if o.Kind != "Kustomization" && o.Metadata.Name == "" {
				t.Errorf("%s: document %d (%s) has no metadata.name", f, i+1, o.Kind)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

func findObject(objs []k8sObject, kind, name string) *k8sObject {
	for i := range objs {
		if objs[i].Kind == kind && objs[i].Metadata.Name == name {
			return &objs[i]
		}
	}
	return nil
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func firstBool(ps ...*bool) bool {
	for _, p := range ps {
		if p != nil {
			return *p
		}
	}
	return false
}

// parseBytes reads a Kubernetes quantity (512Mi, 1G) or a GOMEMLIMIT
// (450MiB, 1GiB, 1000000).
func parseBytes(s string) (int64, error) {
	m := regexp.MustCompile(`^(\d+)\s*([KMGT]i?)?B?$`).FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a byte size", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, err
	}
	mult := map[string]int64{"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
	return n * mult[m[2]], nil
}

// ---------------------------------------------------------------------------
// systemd helpers

// loadUnit reads a unit file into "Section.Key" -> values in order.
func loadUnit(t *testing.T, p string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string][]string{}
	section := ""
	var pending strings.Builder
	for _, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		if pending.Len() == 0 && (line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";")) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			pending.WriteString(cont + " ")
			continue
		}
		pending.WriteString(line)
		line = pending.String()
		pending.Reset()
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = strings.Trim(line, "[]")
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: %q is not Key=Value", p, line)
			continue
		}
		unit[section+"."+strings.TrimSpace(k)] = append(unit[section+"."+strings.TrimSpace(k)], strings.TrimSpace(v))
	}
	return unit
}

// parseSystemdSpan reads a systemd time span: "90", "120s", "2min 30s".
func parseSystemdSpan(s string) (time.Duration, error) {
	if s == "infinity" {
		return time.Duration(1<<63 - 1), nil
	}
	units := map[string]time.Duration{
		"": time.Second, "ms": time.Millisecond, "msec": time.Millisecond,
		"s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
		"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
		"h": time.Hour, "hr": time.Hour, "hour": time.Hour, "hours": time.Hour,
	}
	re := regexp.MustCompile(`^(\d+)\s*([a-z]*)\s*`)
	var total time.Duration
	rest := strings.TrimSpace(s)
	if rest == "" {
		return 0, errors.New("empty")
	}
	for rest != "" {
		m := re.FindStringSubmatch(rest)
		if m == nil {
			return 0, fmt.Errorf("%q is not a time span", s)
		}
		n, _ := strconv.Atoi(m[1])
		u, ok := units[m[2]]
		if !ok {
			return 0, fmt.Errorf("%q: unknown unit %q", s, m[2])
		}
		total += time.Duration(n) * u
		rest = rest[len(m[0]):]
	}
	return total, nil
}

// loadEnvFile reads KEY=value lines (an EnvironmentFile).
func loadEnvFile(t *testing.T, p string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: %q is not KEY=value", p, line)
			continue
		}
		env[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return env
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestCheckers checks the parsers the tests above rely on, so that a bug in
// them cannot make a broken artifact pass.
func TestCheckers(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{"90", 90 * time.Second}, {"120s", 2 * time.Minute}, {"2min 30s", 150 * time.Second},
		{"1h", time.Hour}, {"500ms", 500 * time.Millisecond},
	} {
		if got, err := parseSystemdSpan(c.in); err != nil || got != c.want {
			t.Errorf("parseSystemdSpan(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	if _, err := parseSystemdSpan("2 fortnights"); err == nil {
		t.Error(`parseSystemdSpan("2 fortnights"): no error`)
	}

	for _, c := range []struct {
		pattern, subject string
		want             bool
	}{
		{"fired.>", "fired.orders", true}, {"fired.>", "fired", false}, {"fired.*", "fired.a.b", false},
		{"fired.*", "fired.a", true}, {"a.b", "a.b", true}, {"a.b", "a.c", false}, {">", "x", true},
	} {
		if got := natsSubjectMatch(c.pattern, c.subject); got != c.want {
			t.Errorf("natsSubjectMatch(%q, %q) = %v", c.pattern, c.subject, got)
		}
	}

	for _, c := range []struct {
		tag, want string
		ok        bool
	}{
		{"1.26", "1.26.8", true}, {"1.27", "1.26.8", true}, {"1.25", "1.26.8", false},
		{"1.26.7", "1.26.8", false}, {"1.26.8-bookworm", "1.26.8", true}, {"2", "1.26.8", true},
	} {
		if got := goTagSatisfies(c.tag, c.want); got != c.ok {
			t.Errorf("goTagSatisfies(%q, %q) = %v", c.tag, c.want, got)
		}
	}

	ig := parseDockerignore("# c\n.git\n**/*_test.go\ndeploy\n*.md\n!README.md\nbin/\n")
	for p, want := range map[string]bool{
		".git/HEAD": true, "pkg/a/a_test.go": true, "a_test.go": true, "pkg/a/a.go": false,
		"deploy/Dockerfile": true, "deploy": true, "deployment.go": false, "NOTES.md": true,
		"README.md": false, "pkg/x.md": false, "bin/delaybridge": true, "go.mod": false,
	} {
		if got := ig.excludes(p); got != want {
			t.Errorf("dockerignore excludes(%q) = %v, want %v", p, got, want)
		}
	}

	for in, want := range map[string]int64{"512Mi": 512 << 20, "450MiB": 450 << 20, "1G": 1e9, "1000": 1000, "2Gi": 2 << 30} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}

	cmd := help(t, "health")
	if f, ok := cmd.flags["--url"]; !ok || !f.value {
		t.Errorf("help(health): --url = %+v, %v; want a flag that takes a value", f, ok)
	}
	if f, ok := cmd.flags["--ready"]; !ok || f.value {
		t.Errorf("help(health): --ready = %+v, %v; want a boolean flag", f, ok)
	}
	if f, ok := cmd.flags["-c"]; !ok || f.long != "config" {
		t.Errorf("help(health): -c = %+v, %v; want the global --config", f, ok)
	}
	if cmd.positionals {
		t.Error("help(health): positionals allowed, want none")
	}
	if !help(t, "inspect").positionals {
		t.Error("help(inspect): no positionals allowed, want an ID")
	}
}

// The broker blocks of ingests and sinks, nil when of another kind.
func kafkaIn(in config.Ingest) *kafkabroker.IngestConfig {
	b, _ := in.Broker.(*kafkabroker.IngestConfig)
	return b
}

func rabbitIn(in config.Ingest) *rabbitbroker.IngestConfig {
	b, _ := in.Broker.(*rabbitbroker.IngestConfig)
	return b
}

func natsIn(in config.Ingest) *natsbroker.IngestConfig {
	b, _ := in.Broker.(*natsbroker.IngestConfig)
	return b
}

func kafkaOut(s config.Sink) *kafkabroker.SinkConfig {
	b, _ := s.Broker.(*kafkabroker.SinkConfig)
	return b
}

func rabbitOut(s config.Sink) *rabbitbroker.SinkConfig {
	b, _ := s.Broker.(*rabbitbroker.SinkConfig)
	return b
}

func natsOut(s config.Sink) *natsbroker.SinkConfig {
	b, _ := s.Broker.(*natsbroker.SinkConfig)
	return b
}
