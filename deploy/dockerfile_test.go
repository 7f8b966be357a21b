package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/version"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

const (
	dockerfileName   = "Dockerfile"
	dockerignoreName = "Dockerfile.dockerignore" // BuildKit reads it instead of a root .dockerignore
)

// dockerfile is what the other checks need from deploy/Dockerfile: how its
// final stage runs.
type dockerfile struct {
	builder    instructions.Stage
	buildArgs  []string // the build's ARG defaults, KEY=value, to expand words with
	final      instructions.Stage
	entrypoint []string // exec form
	cmd        []string // exec form
	expose     []string // port numbers
	env        map[string]string
}

// command is what a container of the image runs with an entrypoint and a
// command override (nil: none), by Docker's and Kubernetes' rules: an
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

// loadDockerfile parses dir/Dockerfile with BuildKit's parser and instruction
// parser (what `docker build` runs first, with its build checks as errors).
func loadDockerfile(ps *problems, dir string) *dockerfile {
	file := filepath.Join(dir, dockerfileName)
	data, ok := readFile(ps, file)
	if !ok {
		return nil
	}
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		ps.add("%s: %v", file, err)
		return nil
	}
	for _, w := range res.Warnings {
		ps.add("%s: line %d: %s", file, w.Location.Start.Line, w.Short)
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		line := 0
		if len(loc) > 0 {
			line = loc[0].Start.Line
		}
		ps.add("%s: line %d: build check %s: %s", file, line, rule, msg)
	}})
	stages, metaArgs, err := instructions.Parse(res.AST, lint)
	if err != nil {
		ps.add("%s: %v", file, err)
		return nil
	}
	if len(stages) < 2 {
		ps.add("%s: want a multi-stage build (a Go builder, then a small final image), got %d stage(s)", file, len(stages))
		return nil
	}
	d := &dockerfile{builder: stages[0], final: stages[len(stages)-1], env: map[string]string{}}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				d.buildArgs = append(d.buildArgs, kv.Key+"="+*kv.Value)
			}
		}
	}
	for _, c := range d.builder.Commands {
		if a, ok := c.(*instructions.ArgCommand); ok {
			for _, kv := range a.Args {
				if kv.Value != nil {
					d.buildArgs = append(d.buildArgs, kv.Key+"="+*kv.Value)
				}
			}
		}
	}
	for _, c := range d.final.Commands {
		switch c := c.(type) {
		case *instructions.EntrypointCommand:
			d.entrypoint = execForm(ps, file, c.String(), c.ShellDependantCmdLine)
		case *instructions.CmdCommand:
			d.cmd = execForm(ps, file, c.String(), c.ShellDependantCmdLine)
		case *instructions.ExposeCommand:
			for _, p := range c.Ports {
				p, _, _ = strings.Cut(p, "/")
				d.expose = append(d.expose, p)
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				d.env[kv.Key] = kv.Value
			}
		}
	}
	if len(d.entrypoint) == 0 {
		ps.add("%s: the final stage has no ENTRYPOINT (exec form)", file)
		return nil
	}
	return d
}

// execForm is an ENTRYPOINT's or CMD's argv; distroless has no shell.
func execForm(ps *problems, file, instr string, c instructions.ShellDependantCmdLine) []string {
	if c.PrependShell {
		ps.add("%s: %s: want the exec form [\"...\"] (distroless has no shell)", file, instr)
		return nil
	}
	return c.CmdLine
}

// expand expands a word with the build's ARG defaults, as BuildKit does.
func (d *dockerfile) expand(word string, extra ...string) (string, error) {
	s, _, err := shell.NewLex('\\').ProcessWord(word, shell.EnvsFromSlice(append(slices.Clone(d.buildArgs), extra...)))
	return s, err
}

// goBuild finds the builder's RUN ... go build and splits it into words as
// the shell would, with VERSION set to version.
func (d *dockerfile) goBuild(ps *problems, file, version string) (run *instructions.RunCommand, words []string) {
	for _, c := range d.builder.Commands {
		r, ok := c.(*instructions.RunCommand)
		if !ok || !strings.Contains(strings.Join(r.CmdLine, " "), "go build") {
			continue
		}
		env := shell.EnvsFromSlice(append(slices.Clone(d.buildArgs), "TARGETOS=linux", "TARGETARCH=amd64", "VERSION="+version))
		words, err := shell.NewLex('\\').ProcessWords(strings.Join(r.CmdLine, " "), env)
		if err != nil {
			ps.add("%s: %s: %v", file, r.String(), err)
		}
		return r, words
	}
	ps.add("%s: the first stage has no RUN ... go build", file)
	return nil, nil
}

// checkDockerfile checks dir/Dockerfile against the code.
func checkDockerfile(dir string) problems {
	var ps problems
	file := filepath.Join(dir, dockerfileName)
	df := loadDockerfile(&ps, dir)
	if df == nil {
		return ps
	}

	// The builder: a golang image new enough for go.mod, building like `make build`.
	base, err := df.expand(df.builder.BaseName)
	if err != nil {
		ps.add("%s: FROM %s: %v", file, df.builder.BaseName, err)
	}
	image, tag, _ := strings.Cut(base, ":")
	if image != "golang" && image != "docker.io/library/golang" {
		ps.add("%s: first stage FROM %s: want golang:<version>", file, base)
	} else if want, err := goModVersion(); err != nil {
		ps.add("%v", err)
	} else if !goTagSatisfies(tag, want) {
		ps.add("%s: builder golang:%s is older than go.mod's go %s (golang images set GOTOOLCHAIN=local, so the build would fail)", file, tag, want)
	}
	if run, words := df.goBuild(&ps, file, "v0"); run != nil {
		if !slices.Contains(words, mainPackage) {
			ps.add("%s: %s: does not build %s", file, run.String(), mainPackage)
		}
		// Built like `make build`: the same environment and flags, as make
		// itself expands the recipe (VERSION=v0 on both sides).
		if mk, err := makeBuild(); err != nil {
			ps.add("%v", err)
		} else {
			got := goBuildSettings(words)
			for _, k := range sortedKeys(mk) {
				if got[k] != mk[k] {
					ps.add("%s: the go build RUN has %s %q, `make build` has %q: the image would not be built like make build", file, k, got[k], mk[k])
				}
			}
		}
		if ld := ldflags(words); !strings.Contains(ld, "-X "+versionSymbol+"=") {
			ps.add("%s: -ldflags %q does not stamp %s", file, ld, versionSymbol)
		}
		// GetMounts needs the flags expanded, as BuildKit does before it runs.
		if err := run.Expand(func(w string) (string, error) { return df.expand(w) }); err != nil {
			ps.add("%s: %s: %v", file, run.String(), err)
		}
		cached := map[string]bool{}
		for _, m := range instructions.GetMounts(run) {
			if m.Type == instructions.MountTypeCache {
				cached[m.Target] = true
			}
		}
		for _, want := range []string{"/go/pkg/mod", "/root/.cache/go-build"} {
			if !cached[want] {
				ps.add("%s: the go build RUN has no --mount=type=cache,target=%s", file, want)
			}
		}
	}

	// The final stage: static, non-root, the binary where ENTRYPOINT runs it.
	final := df.final
	if !(strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") && strings.HasSuffix(final.BaseName, ":nonroot")) && final.BaseName != "scratch" {
		ps.add("%s: final FROM %s: want gcr.io/distroless/static*:nonroot or scratch (a static binary needs nothing else)", file, final.BaseName)
	}
	var user string
	copied := false
	var health *instructions.HealthCheckCommand
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.CopyCommand:
			if c.From != "" && c.DestPath == df.entrypoint[0] {
				copied = true
			}
		case *instructions.StopSignalCommand:
			if c.Signal != "SIGTERM" && c.Signal != "15" {
				ps.add("%s: STOPSIGNAL %s: delaybridge stops gracefully on SIGTERM", file, c.Signal)
			}
		case *instructions.HealthCheckCommand:
			health = c
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil {
		ps.add("%s: final stage USER %q: want a numeric non-root uid, so that Kubernetes' runAsNonRoot can verify it", file, user)
	} else if n == 0 {
		ps.add("%s: USER %s is root", file, user)
	}
	if !copied {
		ps.add("%s: ENTRYPOINT runs %s, but no COPY --from=... puts the binary there", file, df.entrypoint[0])
	}

	where := file + ": ENTRYPOINT+CMD"
	inv := checkInvocation(&ps, where, df.command(nil, nil))
	if inv.sub != "run" {
		ps.add("%s runs %q, want run", where, inv.sub)
	}
	if cfg := inv.flags["config"]; cfg == "" {
		ps.add("%s gives no --config", where)
	} else if env, ok := df.env["DELAYBRIDGE_CONFIG"]; ok && env != cfg {
		ps.add("%s: ENV DELAYBRIDGE_CONFIG=%s but CMD runs --config %s", file, env, cfg)
	}

	switch {
	case health == nil:
		ps.add("%s: no HEALTHCHECK (write HEALTHCHECK NONE, with the reason, if there is none)", file)
	case len(health.Health.Test) > 0 && health.Health.Test[0] == "NONE":
	case len(health.Health.Test) == 0 || health.Health.Test[0] != "CMD":
		ps.add("%s: %s: want the exec form CMD [\"/usr/local/bin/delaybridge\", \"health\", ...] (distroless has no shell)", file, health.String())
	default:
		where := file + ": HEALTHCHECK"
		inv := checkInvocation(&ps, where, health.Health.Test[1:])
		if inv.sub != "health" {
			ps.add("%s runs %q, want health", where, inv.sub)
		} else if u := checkHealthURL(&ps, where, inv, "/healthz"); u != nil && !slices.Contains(df.expose, u.Port()) {
			ps.add("%s probes port %s, but the image EXPOSEs %v", where, u.Port(), df.expose)
		}
	}
	return ps
}

func TestDockerfile(t *testing.T) { checkDockerfile(".").report(t) }

// makeBuild is goBuildSettings of the command `make build` runs, from
// `make -n` (make's own expansion of the Makefile).
var makeBuild = sync.OnceValues(func() (map[string]string, error) {
	cmd := exec.Command("make", "-s", "-n", "build", "VERSION=v0", "GO=go")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("make -n build: %w", err)
	}
	words, err := shell.NewLex('\\').ProcessWords(strings.TrimSpace(string(out)), shell.EnvsFromSlice(nil))
	if err != nil || !slices.Contains(words, "build") {
		return nil, fmt.Errorf("make -n build printed %q, not a go build (%v)", out, err)
	}
	return goBuildSettings(words), nil
})

// goBuildSettings is what decides the binary in a go build command line:
// the CGO_ENABLED it runs with and the -trimpath, -tags and -ldflags flags.
func goBuildSettings(words []string) map[string]string {
	m := map[string]string{"CGO_ENABLED": "", "-trimpath": "", "-tags": "", "-ldflags": ""}
	for i, w := range words {
		if v, ok := strings.CutPrefix(w, "CGO_ENABLED="); ok {
			m["CGO_ENABLED"] = v
		}
		if w == "-trimpath" {
			m[w] = "true"
		}
		if (w == "-tags" || w == "-ldflags") && i+1 < len(words) {
			m[w] = words[i+1]
		}
		for _, f := range []string{"-tags", "-ldflags", "-trimpath"} {
			if v, ok := strings.CutPrefix(w, f+"="); ok {
				m[f] = v
			}
		}
	}
	return m
}

// ldflags is the value of -ldflags in a go build command's words.
func ldflags(words []string) string {
	for i, w := range words {
		if w == "-ldflags" && i+1 < len(words) {
			return words[i+1]
		}
		if v, ok := strings.CutPrefix(w, "-ldflags="); ok {
			return v
		}
	}
	return ""
}

// goModVersion is the root go.mod's go line.
func goModVersion() (string, error) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^go\s+(\S+)`).FindSubmatch(data)
	if m == nil {
		return "", errors.New("go.mod: no go line")
	}
	return string(m[1]), nil
}

// goTagSatisfies reports whether a golang image tag ("1.26", "1.26.8",
// "1.26-bookworm") provides at least Go version want. A tag without a patch
// version floats to the newest patch release of that line.
func goTagSatisfies(tag, want string) bool {
	tag, _, _ = strings.Cut(tag, "-")
	if strings.Count(tag, ".") < 2 { // floating: compare language versions
		return version.Compare("go"+tag, version.Lang("go"+want)) >= 0
	}
	return version.Compare("go"+tag, "go"+want) >= 0
}

// TestDockerfileVersionLdflag builds the binary with the Dockerfile's
// -ldflags and checks that `delaybridge version` prints the stamped version:
// it fails when -X no longer names the version variable.
func TestDockerfileVersionLdflag(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	var ps problems
	df := loadDockerfile(&ps, ".")
	if df == nil {
		ps.report(t)
		t.FailNow()
	}
	const stamp = "deploy-test-1.2.3"
	_, words := df.goBuild(&ps, dockerfileName, stamp)
	ps.report(t)
	ld := ldflags(words)
	if ld == "" {
		t.Fatalf("%s: no -ldflags in the go build RUN", dockerfileName)
	}
	bin := filepath.Join(t.TempDir(), binaryName)
	args := []string{"build", "-ldflags", ld, "-o", bin}
	if tags := goBuildSettings(words)["-tags"]; tags != "" {
		args = append(args, "-tags", tags) // the image's build, e.g. without the dev command
	}
	// Built like this test binary (-race or not), so that the packages come
	// from the build cache and only the link is new.
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	build := exec.Command("go", append(args, mainPackage)...)
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: go build -ldflags %q %s: %v\n%s", dockerfileName, ld, mainPackage, err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("delaybridge version: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); !strings.HasSuffix(got, stamp) {
		t.Errorf("%s: built with -ldflags %q, `delaybridge version` printed %q, want %q: does -X still name %s?", dockerfileName, ld, got, stamp, versionSymbol)
	}
}

var (
	buildInputsMu    sync.Mutex
	buildInputsCache = map[string][]string{}
)

// buildInputs lists the files the image build reads: go.mod, go.sum, and the
// Go and embedded files of every package of this module that the binary is
// built from (for linux, without cgo, with the build tags tags, as in the
// Dockerfile).
func buildInputs(tags string) ([]string, error) {
	buildInputsMu.Lock()
	defer buildInputsMu.Unlock()
	if in, ok := buildInputsCache[tags]; ok {
		return in, nil
	}
	cmd := exec.Command("go", "list", "-deps", "-tags="+tags, "-json=Dir,Module,GoFiles,EmbedFiles", mainPackage)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps %s: %w", mainPackage, err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		return nil, err
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
			return nil, err
		}
		if p.Module == nil || p.Module.Path != modulePath {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			return nil, err
		}
		for _, f := range append(p.GoFiles, p.EmbedFiles...) {
			needed = append(needed, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if len(needed) < 5 {
		return nil, fmt.Errorf("go list found only %v: the check would prove nothing", needed)
	}
	buildInputsCache[tags] = needed
	return needed, nil
}

// checkDockerignore checks that dir/Dockerfile.dockerignore, read and matched
// by BuildKit's own code (moby/patternmatcher), keeps every input of
// dir/Dockerfile's go build.
func checkDockerignore(dir string) problems {
	var ps problems
	df := loadDockerfile(&ps, dir)
	if df == nil {
		return ps
	}
	_, words := df.goBuild(&ps, filepath.Join(dir, dockerfileName), "v0")
	file := filepath.Join(dir, dockerignoreName)
	f, err := os.Open(file)
	if err != nil {
		ps.add("%v", err)
		return ps
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		ps.add("%s: %v", file, err)
		return ps
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		ps.add("%s: %v", file, err)
		return ps
	}
	needed, err := buildInputs(goBuildSettings(words)["-tags"])
	if err != nil {
		ps.add("%v", err)
		return ps
	}
	for _, p := range needed {
		excluded, err := pm.MatchesOrParentMatches(p)
		switch {
		case err != nil:
			ps.add("%s: matching %s: %v", file, p, err)
			return ps
		case excluded:
			ps.add("%s excludes %s, which the image build needs", file, p)
		}
	}
	return ps
}

func TestDockerignore(t *testing.T) { checkDockerignore(".").report(t) }

func TestGoTagSatisfies(t *testing.T) {
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
}
