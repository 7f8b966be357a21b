package deploy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// edit replaces old, which must occur exactly once, with new.
type edit struct{ old, new string }

// brokenCases break one deploy file each: a misspelt field or a wrong type,
// which its ecosystem's parser must refuse, or a value the cross-checks
// against the code must refuse. want is a piece of the expected message.
var brokenCases = []struct {
	name  string
	file  string // relative to deploy/
	edits []edit
	check func(dir string) problems
	want  string
}{
	// Dockerfile: BuildKit's parser.
	{"misspelt instruction", dockerfileName, []edit{{"\nENTRYPOINT [", "\nENTRYPONT ["}}, checkDockerfile, "unknown instruction: ENTRYPONT"},
	{"misspelt flag", dockerfileName, []edit{{"COPY --from=build", "COPY --form=build"}}, checkDockerfile, "unknown flag: --form"},
	{"wrong type", dockerfileName, []edit{{"--interval=10s", "--interval=ten"}}, checkDockerfile, `invalid duration "ten"`},
	{"admin port not exposed", dockerfileName, []edit{{"EXPOSE 7070", "EXPOSE 8080"}}, checkDockerfile, "but the image EXPOSEs [8080]"},
	{"user by name", dockerfileName, []edit{{"USER 65532:65532", "USER nonroot"}}, checkDockerfile, `USER "nonroot": want a numeric non-root uid`},
	{"built unlike make build", dockerfileName, []edit{{"go build -trimpath -tags nodev", "go build -trimpath"}}, checkDockerfile, "the go build RUN has -tags \"\", `make build` has \"nodev\""},
	{"no version stamp", dockerfileName, []edit{{"cli.version=${VERSION}", "cli.Version=${VERSION}"}}, checkDockerfile, "does not stamp " + versionSymbol},

	// Dockerfile.dockerignore: BuildKit's pattern matcher.
	{"malformed pattern", dockerignoreName, []edit{{"\n.git\n", "\n.git\npkg/[\n"}}, checkDockerignore, "syntax error in pattern"},
	{"excludes the production build's file", dockerignoreName, []edit{{"\n.git\n", "\n.git\ncmd/delaybridge/cli/nodev.go\n"}}, checkDockerignore, "excludes cmd/delaybridge/cli/nodev.go"},
	{"excludes sources", dockerignoreName, []edit{{"**/*_test.go", "**/*.go"}}, checkDockerignore, "excludes cmd/delaybridge/main.go, which the image build needs"},

	// docker-compose.yml: compose-go.
	{"misspelt field", composeName, []edit{{"stop_grace_period: 30s", "stop_grace_perod: 30s"}}, checkCompose, "services.delaybridge.stop_grace_perod"},
	{"wrong type", composeName, []edit{{"read_only: true", "read_only: maybe"}}, checkCompose, "services.delaybridge.read_only: failed to cast to expected type: invalid boolean: maybe"},
	{"undefined dependency", composeName, []edit{{"nats-init: {condition: service_completed_successfully}", "nats-setup: {condition: service_completed_successfully}"}}, checkCompose, "nats-setup"},
	{"grace under the shutdown rule", composeName, []edit{{"stop_grace_period: 30s", "stop_grace_period: 24s"}}, checkCompose, "services.delaybridge.stop_grace_period is 24s, less than shutdown_timeout 20s"},
	{"variable without default", composeName, []edit{{"${RABBITMQ_PASSWORD:-delaybridge}@rabbitmq", "${RABBITMQ_PASSWORD}@rabbitmq"}}, checkCompose, "${RABBITMQ_PASSWORD} has no default"},
	{"sink queue not declared", composeName, []edit{{"name=orders.expired", "name=orders.expire"}}, checkCompose, `rabbitmq queue "orders.expired" is created by no service's command`},

	// compose/config.yaml: config.Parse.
	{"misspelt key", "compose/config.yaml", []edit{{"shutdown_timeout: 20s", "shutdown_timout: 20s"}}, checkCompose, "shutdown_timout"},
	{"wrong type", "compose/config.yaml", []edit{{"  shards: 16", "  shards: sixteen"}}, checkCompose, "redis.shards"},

	// kubernetes/: the API types, strictly.
	{"misspelt field", "kubernetes/deployment.yaml", []edit{{"terminationGracePeriodSeconds: 30", "terminationGracePeriodSecond: 30"}}, checkKubernetes, `unknown field "spec.template.spec.terminationGracePeriodSecond"`},
	{"wrong type", "kubernetes/deployment.yaml", []edit{{"replicas: 2", "replicas: two"}}, checkKubernetes, "spec.replicas of type int32"},
	{"duplicate field", "kubernetes/deployment.yaml", []edit{{"replicas: 2", "replicas: 2\n  replicas: 3"}}, checkKubernetes, `key "replicas" already set`},
	{"grace under the shutdown rule", "kubernetes/deployment.yaml", []edit{{"terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 24"}}, checkKubernetes, "terminationGracePeriodSeconds is 24s, less than shutdown_timeout 20s"},
	{"readiness on /healthz", "kubernetes/deployment.yaml", []edit{{"path: /readyz", "path: /healthz"}}, checkKubernetes, `readinessProbe.httpGet.path: "/healthz", want /readyz`},
	{"misspelt field", "kubernetes/configmap.yaml", []edit{{"\ndata:\n", "\ndta:\n"}}, checkKubernetes, `unknown field "dta"`},
	{"wrong type in the configuration", "kubernetes/configmap.yaml", []edit{{"      shards: 16", "      shards: sixteen"}}, checkKubernetes, "redis.shards"},
	{"misspelt field", "kubernetes/service.yaml", []edit{{"targetPort: admin", "targetPrt: admin"}}, checkKubernetes, `unknown field "spec.ports[0].targetPrt"`},
	{"wrong type", "kubernetes/service.yaml", []edit{{"port: 7070", "port: seventy"}}, checkKubernetes, "spec.ports.port of type int32"},
	{"target port unknown", "kubernetes/service.yaml", []edit{{"targetPort: admin", "targetPort: metrics"}}, checkKubernetes, "targetPort metrics is no containerPort"},
	{"misspelt field", "kubernetes/poddisruptionbudget.yaml", []edit{{"maxUnavailable: 1", "maxUnavailabel: 1"}}, checkKubernetes, `unknown field "spec.maxUnavailabel"`},
	{"wrong type", "kubernetes/poddisruptionbudget.yaml", []edit{{"maxUnavailable: 1", "maxUnavailable: [1]"}}, checkKubernetes, "maxUnavailable"},
	{"misspelt field", "kubernetes/secret.yaml", []edit{{"stringData:", "stringdata:"}}, checkKubernetes, `unknown field "stringdata"`},
	{"wrong type", "kubernetes/secret.yaml", []edit{{"type: Opaque", "type: [Opaque]"}}, checkKubernetes, "Secret.type of type v1.SecretType"},
	{"misspelt field", "kubernetes/kustomization.yaml", []edit{{"resources:", "resource:"}}, checkKubernetes, `unknown field "resource"`},
	{"wrong type", "kubernetes/kustomization.yaml", []edit{{"newTag: latest", "newTag: [latest]"}}, checkKubernetes, "images.newTag of type string"},
	{"image not the Deployment's", "kubernetes/kustomization.yaml", []edit{{"- name: ghcr.io/delaybridge/delaybridge", "- name: ghcr.io/delaybridge/delaybrige"}}, checkKubernetes, "is the image of no container"},
	{"misspelt field", "kubernetes/sidecar-example.yaml", []edit{{"restartPolicy: Always\n", "restartPolicyy: Always\n"}}, checkKubernetes, `unknown field "spec.template.spec.initContainers[0].restartPolicyy"`},
	{"wrong type", "kubernetes/sidecar-example.yaml", []edit{{"periodSeconds: 2\n", "periodSeconds: 2s\n"}}, checkKubernetes, "periodSeconds of type int32"},
	{"sidecar as a plain container", "kubernetes/sidecar-example.yaml", []edit{
		{"      initContainers:\n", "      containers:\n"},
		{"      containers:\n        - name: app", "        - name: app"},
	}, checkKubernetes, "container delaybridge runs beside the app with no start order"},
	{"sidecar without startup probe", "kubernetes/sidecar-example.yaml", []edit{{"          startupProbe:\n" +
		"            exec:\n" +
		"              command: [\"/usr/local/bin/delaybridge\", \"health\", \"--url\", \"http://127.0.0.1:7070/healthz\", \"--timeout\", \"2s\"]\n" +
		"            periodSeconds: 2\n" +
		"            timeoutSeconds: 3\n" +
		"            failureThreshold: 60\n", ""}}, checkKubernetes, "sidecar delaybridge has no startupProbe"},
	{"grace under the shutdown rule", "kubernetes/sidecar-example.yaml", []edit{{"terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 14"}}, checkKubernetes, "terminationGracePeriodSeconds is 14s, less than shutdown_timeout 10s"},
	{"app pointed elsewhere", "kubernetes/sidecar-example.yaml", []edit{{"value: http://127.0.0.1:7070", "value: http://127.0.0.1:8080"}}, checkKubernetes, "is not the sidecar's admin server"},

	// systemd/: systemd-analyze verify, and the code.
	{"misspelt key", systemdUnit, []edit{{"ProtectSystem=strict", "ProtectSystm=strict"}}, checkSystemd, "Unknown key 'ProtectSystm' in section [Service]"},
	{"wrong type", systemdUnit, []edit{{"TimeoutStopSec=40s", "TimeoutStopSec=forty"}}, checkSystemd, "Failed to parse"},
	{"grace under the shutdown rule", systemdUnit, []edit{{"TimeoutStopSec=40s", "TimeoutStopSec=34s"}}, checkSystemd, "TimeoutStopSec=34s is 34s, less than shutdown_timeout 30s (the default)"},
	{"misspelt flag", systemdUnit, []edit{{"validate --config", "validate --conifg"}}, checkSystemd, "--conifg is no flag of `delaybridge validate`"},
	{"malformed line", systemdEnv, []edit{{"\nREDIS_PASSWORD=", "\nREDIS PASSWORD="}}, checkSystemd, systemdEnv},
}

// TestBrokenCopies runs each check on a copy of deploy/ with one file
// broken, and expects it to fail: each parser and cross-check catches what it
// is meant to catch.
func TestBrokenCopies(t *testing.T) {
	// The copies must pass unbroken, or a failure would prove nothing.
	pristine := copyDeploy(t)
	for name, check := range map[string]func(string) problems{
		"Dockerfile": checkDockerfile, "dockerignore": checkDockerignore, "compose": checkCompose,
		"kubernetes": checkKubernetes, "systemd": checkSystemd,
	} {
		if ps := check(pristine); len(ps) > 0 {
			t.Fatalf("%s: the unbroken copy in %s fails: %q", name, pristine, ps)
		}
	}

	for _, c := range brokenCases {
		t.Run(c.file+"/"+c.name, func(t *testing.T) {
			dir := copyDeploy(t)
			file := filepath.Join(dir, c.file)
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			for _, e := range c.edits {
				if n := strings.Count(text, e.old); n != 1 {
					t.Fatalf("%s: %q occurs %d times, want once: update this case along with the file", c.file, e.old, n)
				}
				text = strings.Replace(text, e.old, e.new, 1)
			}
			if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			ps := c.check(dir)
			for _, p := range ps {
				if strings.Contains(p, c.want) {
					t.Logf("fails as expected: %s", strings.ReplaceAll(p, dir+"/", ""))
					return
				}
			}
			t.Errorf("%s broken (%s): no problem mentions %q; got %q", c.file, c.name, c.want, ps)
		})
	}
}

// copyDeploy copies the deploy files (not the Go files) to a temp dir's
// deploy/, so that compose's build context ("..") stays inside it.
func copyDeploy(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "deploy")
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, p), 0o755)
		}
		if strings.HasSuffix(p, ".go") || p == "go.mod" || p == "go.sum" || strings.HasSuffix(p, ".md") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, p), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
