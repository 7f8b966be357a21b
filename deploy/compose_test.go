package deploy_test

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/template"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
)

const (
	composeName = "docker-compose.yml"
	// composeStopDefault is compose's stop_grace_period when none is given.
	composeStopDefault = 10 * time.Second
)

// loadCompose loads the docker-compose.yml in dir with compose-go, the compose
// specification's loader that `docker compose` uses: schema validation
// (unknown keys and wrong types are errors), interpolation, normalization
// and the consistency checks (depends_on names a service, and so on). The
// host environment is empty, so that the file is checked as it runs out of
// the box, with its ${VAR:-default}s.
func loadCompose(ps *problems, dir string) *types.Project {
	file := filepath.Join(dir, composeName)
	abs, err := filepath.Abs(dir)
	if err != nil {
		ps.add("%v", err)
		return nil
	}
	details := types.ConfigDetails{
		WorkingDir:  abs,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(abs, composeName)}},
		Environment: types.Mapping{},
	}
	// A variable without a default would be empty unless the user sets it:
	// note each while compose-go interpolates.
	noDefault := map[string]bool{}
	project, err := loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.ResolvePaths = true
		interp, substitute := *o.Interpolate, o.Interpolate.Substitute
		interp.Substitute = func(s string, m template.Mapping) (string, error) {
			for name, v := range template.ExtractVariables(map[string]any{"": s}, nil) {
				if _, set := m(name); !set && v.DefaultValue == "" && !v.Required {
					noDefault[name] = true
				}
			}
			return substitute(s, m)
		}
		o.Interpolate = &interp
	})
	if err != nil {
		ps.add("%s: %v", file, err)
		return nil
	}
	for _, name := range sortedKeys(noDefault) {
		ps.add("%s: ${%s} has no default: the stack would not start without it in the environment", file, name)
	}
	return project
}

// checkCompose checks the docker-compose.yml in dir, and the configurations
// it mounts, against the code and the Dockerfile in dir.
func checkCompose(dir string) problems {
	var ps problems
	file := filepath.Join(dir, composeName)
	project := loadCompose(&ps, dir)
	df := loadDockerfile(&ps, dir)
	if project == nil || df == nil {
		return ps
	}
	dockerfile, _ := filepath.Abs(filepath.Join(dir, dockerfileName))

	// The services that are delaybridge: those built from deploy/Dockerfile.
	var names []string
	for _, name := range sortedKeys(project.Services) {
		b := project.Services[name].Build
		if b == nil {
			continue
		}
		df := b.Dockerfile
		if df == "" {
			df = "Dockerfile"
		}
		if !filepath.IsAbs(df) {
			df = filepath.Join(b.Context, df)
		}
		if filepath.Clean(df) == dockerfile {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		ps.add("%s: no service is built from %s (build.context + build.dockerfile)", file, dockerfileName)
		return ps
	}

	commands := composeCommands(project)
	mounted := map[string]bool{}
	for _, name := range names {
		svc := project.Services[name]
		where := fmt.Sprintf("%s: services.%s", file, name)
		inv := checkInvocation(&ps, where+".command", df.command(svc.Entrypoint, svc.Command))
		if inv.sub != "run" {
			ps.add("%s runs %q, want run", where, inv.sub)
			continue
		}
		cfgPath := inv.flags["config"]
		src := ""
		for _, v := range svc.Volumes {
			if v.Target == cfgPath {
				src = v.Source
			}
		}
		if src == "" {
			ps.add("%s.volumes: nothing is mounted at --config %q", where, cfgPath)
			continue
		}
		mounted[filepath.Clean(src)] = true
		cfgWhere := fmt.Sprintf("%s (mounted by %s)", relTo(dir, src), where)
		data, ok := readFile(&ps, src)
		if !ok {
			continue
		}
		env := map[string]string{}
		for k, v := range svc.Environment {
			if v != nil { // nil: passed through from the host, unknown here
				env[k] = *v
			}
		}
		cfg, cfgProblems := loadConfig(data, env)
		ps.addAll(cfgWhere+": with the service's environment", cfgProblems)
		if cfg == nil {
			continue
		}

		// The admin port: published, exposed, probed.
		if host, port := adminPort(&ps, cfgWhere, cfg); port != "" {
			if !slices.ContainsFunc(svc.Ports, func(p types.ServicePortConfig) bool { return fmt.Sprint(p.Target) == port }) {
				ps.add("%s.ports: admin.listen port %s of %s is not published", where, port, cfgWhere)
			} else if isLoopback(host) {
				ps.add("%s: admin.listen %s is the container's loopback: the published port %s reaches nothing (listen on 0.0.0.0 with a token)", cfgWhere, cfg.adminListen, port)
			}
			if !slices.Contains(df.expose, port) {
				ps.add("%s: admin.listen port %s, but %s EXPOSEs %v", cfgWhere, port, dockerfileName, df.expose)
			}
			if hc := svc.HealthCheck; hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE" {
				checkComposeHealthcheck(&ps, where+".healthcheck.test", hc.Test, port)
			} // else the image's HEALTHCHECK, checked by checkDockerfile against EXPOSE
		}

		grace := composeStopDefault
		if svc.StopGracePeriod != nil {
			grace = time.Duration(*svc.StopGracePeriod)
		}
		checkGrace(&ps, where+".stop_grace_period", grace, cfgWhere, cfg.shutdownTimeout)

		// Dependencies: their conditions can be met, and they cover every
		// host the configuration connects to.
		for _, dep := range sortedKeys(svc.DependsOn) {
			if svc.DependsOn[dep].Condition == types.ServiceConditionHealthy && !hasHealthcheck(project.Services[dep]) {
				ps.add("%s.depends_on.%s: condition service_healthy, but services.%s has no healthcheck", where, dep, dep)
			}
		}
		for _, host := range sortedKeys(cfg.hosts) {
			if _, ok := project.Services[host]; !ok {
				ps.add("%s: %s names host %q, which is no service of %s", cfgWhere, cfg.hosts[host], host, file)
			} else if _, ok := svc.DependsOn[host]; !ok {
				ps.add("%s.depends_on: lacks %s, which %s (%s) connects to", where, host, cfgWhere, cfg.hosts[host])
			}
		}
		checkBrokerObjects(&ps, cfgWhere, cfg, commands)

		// Redis is the store of record.
		for _, dep := range sortedKeys(svc.DependsOn) {
			if s := project.Services[dep]; strings.HasPrefix(s.Image, "redis:") {
				checkComposeRedis(&ps, fmt.Sprintf("%s: services.%s", file, dep), s)
			}
		}
	}

	files, _ := filepath.Glob(filepath.Join(dir, "compose", "*.yaml"))
	for _, f := range files {
		if abs, _ := filepath.Abs(f); !mounted[abs] {
			ps.add("%s is the --config of no service built from %s, so nothing here checks it", f, dockerfileName)
		}
	}
	return ps
}

func TestCompose(t *testing.T) { checkCompose(".").report(t) }

func checkComposeHealthcheck(ps *problems, where string, test types.HealthCheckTest, port string) {
	if test[0] != "CMD" {
		ps.add("%s: %q: want [\"CMD\", \"/usr/local/bin/delaybridge\", \"health\", ...] (the image has no shell)", where, test)
		return
	}
	inv := checkInvocation(ps, where, test[1:])
	if u := checkHealthURL(ps, where, inv, "/healthz"); u != nil && u.Port() != port {
		ps.add("%s probes port %s, admin.listen's port is %s", where, u.Port(), port)
	}
}

func hasHealthcheck(s types.ServiceConfig) bool {
	hc := s.HealthCheck
	return hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE"
}

func checkComposeRedis(ps *problems, where string, svc types.ServiceConfig) {
	args := strings.Join(svc.Command, " ")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`--appendonly\s+yes`),
		regexp.MustCompile(`--appendfsync\s+(everysec|always)`),
		regexp.MustCompile(`--maxmemory-policy\s+noeviction`),
	} {
		if !want.MatchString(args) {
			ps.add("%s.command: %q does not match %s: Redis is delaybridge's store of record (AOF on, no eviction)", where, args, want)
		}
	}
	if !slices.ContainsFunc(svc.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == "/data" }) {
		ps.add("%s.volumes: nothing mounted at /data: the AOF would go with the container", where)
	}
}

// composeCommands is every service's entrypoint and command, joined: the
// one-shot services that create topics, queues and streams.
func composeCommands(p *types.Project) string {
	var b strings.Builder
	for _, name := range sortedKeys(p.Services) {
		s := p.Services[name]
		b.WriteString(strings.Join(s.Entrypoint, " ") + " " + strings.Join(s.Command, " ") + "\n")
	}
	return b.String()
}

// checkBrokerObjects checks that the topics, queues and stream subjects that
// a configuration uses but delaybridge does not create are created by some
// service's command.
func checkBrokerObjects(ps *problems, where string, cfg *configFacts, commands string) {
	var subjects []string
	for _, m := range regexp.MustCompile(`--subjects[ =]'?"?([^'" ]+)`).FindAllStringSubmatch(commands, -1) {
		subjects = append(subjects, strings.Split(m[1], ",")...)
	}
	for _, n := range cfg.needs {
		var created bool
		switch n.kind {
		case kafkaTopic:
			created = regexp.MustCompile(`--topic[ =]"?` + regexp.QuoteMeta(n.name) + `\b`).MatchString(commands)
		case rabbitQueue:
			created = regexp.MustCompile(`name=` + regexp.QuoteMeta(n.name) + `(\s|$)`).MatchString(commands)
		case natsStreamSubject:
			// NATS's own subject matching, as the server applies a stream's subjects.
			created = slices.ContainsFunc(subjects, func(p string) bool { return server.SubjectMatchesFilter(n.name, p) })
		}
		if !created {
			ps.add("%s: %s: %s %q is created by no service's command: delaybridge does not create it, and delivery would fail", where, n.field, n.kind, n.name)
		}
	}
}
