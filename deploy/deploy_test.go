// Package deploy_test keeps deploy/ from rotting. No Docker engine, cluster
// or running systemd is needed: each file is read by its own ecosystem's
// parser or validator, and then cross-checked against the code.
//
//   - Dockerfile: BuildKit's parser and instruction parser; the
//     .dockerignore with BuildKit's pattern matcher (moby/patternmatcher).
//   - docker-compose.yml: compose-go, the compose specification's loader
//     (schema validation, interpolation, typed model).
//   - kubernetes/: the Kubernetes API types (k8s.io/api), decoded strictly
//     like `kubectl apply --validate=strict` (unknown or duplicate fields and
//     wrong types are errors); kubernetes/kustomization.yaml with kustomize's
//     own type.
//   - systemd/: `systemd-analyze verify`, and go-systemd's unit parser.
//
// The cross-checks against the code (through codefacts_test.go only):
// every configuration passes config.Parse with exactly the environment its
// container gets; every command line names a real subcommand and real flags;
// the admin port is the one exposed, published and probed, and probe paths
// answer 200 on the real admin handler; every grace period covers the
// shutdown rule (stopBudget); the image is built like `make build`.
//
// broken_test.go proves each check fails on a broken copy of each file.
package deploy_test

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// repoRoot is the repository, relative to this package's directory (where
// go test runs). The checks take the deploy directory as a parameter, so that
// broken_test.go can run them on broken copies.
const repoRoot = ".."

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

// checkGrace reports a grace period shorter than stopBudget.
func checkGrace(ps *problems, where string, grace time.Duration, cfgWhere string, shutdown time.Duration) {
	if grace < stopBudget(shutdown) {
		ps.add("%s is %s, less than shutdown_timeout %s (%s) + %s: the supervisor would SIGKILL a graceful stop",
			where, grace, shutdown, cfgWhere, stopMargin)
	}
}

// problems collects what is wrong with the deploy files. Each entry names
// the file and the field.
type problems []string

func (ps *problems) add(format string, args ...any) { *ps = append(*ps, fmt.Sprintf(format, args...)) }

func (ps *problems) addAll(where string, list []string) {
	for _, p := range list {
		ps.add("%s: %s", where, p)
	}
}

// report fails t with every problem.
func (ps problems) report(t *testing.T) {
	t.Helper()
	for _, p := range ps {
		t.Error(p)
	}
}

// ---------------------------------------------------------------------------
// The binary's command line, from its --help (cobra's usage output).

type cliFlag struct {
	long  string
	value bool // takes a value
}

type cliCommand struct {
	flags       map[string]cliFlag // by "--long" and "-s"
	positionals bool               // Usage names arguments besides flags
	subs        map[string]bool    // subcommands (root only)
}

var (
	helpMu    sync.Mutex
	helpCache = map[string]*cliCommand{}

	flagLine  = regexp.MustCompile(`^\s+(?:-([A-Za-z0-9]), )?--([A-Za-z0-9][A-Za-z0-9-]*)(?: ([A-Za-z0-9]+))?\s{2,}`)
	subLine   = regexp.MustCompile(`^  ([a-z][a-z0-9-]*)\s{2,}`)
	usageArgs = regexp.MustCompile(`\[[^\]]*\](\.\.\.)?|--[a-z-]+(\s+[A-Z][A-Z=]*)?`)
)

// help runs `delaybridge [sub] --help` and reads its flags, subcommands and
// whether it takes arguments.
func help(sub string) (*cliCommand, error) {
	helpMu.Lock()
	defer helpMu.Unlock()
	if c, ok := helpCache[sub]; ok {
		return c, nil
	}
	args := []string{"--help"}
	if sub != "" {
		args = []string{sub, "--help"}
	}
	out, code := runCLI(args...)
	if code != 0 {
		return nil, fmt.Errorf("delaybridge %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	c := &cliCommand{flags: map[string]cliFlag{}, subs: map[string]bool{}}
	section := ""
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		if strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " ") {
			section = line
			if section == "Usage:" && i+1 < len(lines) && sub != "" {
				u := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(lines[i+1]), binaryName+" "+sub))
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
			if m := subLine.FindStringSubmatch(line); m != nil && m[1] != "help" && m[1] != "completion" {
				c.subs[m[1]] = true
			}
		}
	}
	helpCache[sub] = c
	return c, nil
}

type invocation struct {
	sub         string
	flags       map[string]string // by long name
	positionals []string
}

// checkInvocation checks that argv runs a real subcommand of delaybridge with
// real flags, each valued flag with a value, and no arguments where the
// subcommand takes none.
func checkInvocation(ps *problems, where string, argv []string) invocation {
	inv := invocation{flags: map[string]string{}}
	if len(argv) == 0 {
		ps.add("%s: empty command", where)
		return inv
	}
	if path.Base(argv[0]) != binaryName {
		ps.add("%s: runs %s, not the %s binary", where, argv[0], binaryName)
		return inv
	}
	root, err := help("")
	if err != nil {
		ps.add("%s: %v", where, err)
		return inv
	}
	args := argv[1:]
	i := 0 // global flags may come before the subcommand
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		name, _, hasValue := strings.Cut(args[i], "=")
		f, ok := root.flags[name]
		if !ok {
			ps.add("%s: %s is no flag of %s (see %s --help)", where, name, binaryName, binaryName)
			return inv
		}
		if f.value && !hasValue {
			i++
		}
	}
	if i >= len(args) {
		ps.add("%s: %q names no subcommand", where, argv)
		return inv
	}
	inv.sub = args[i]
	if !root.subs[inv.sub] {
		ps.add("%s: %q is no subcommand of %s (it has: %s)", where, inv.sub, binaryName, strings.Join(sortedKeys(root.subs), ", "))
		return inv
	}
	cmd, err := help(inv.sub)
	if err != nil {
		ps.add("%s: %v", where, err)
		return inv
	}
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
			ps.add("%s: %s is no flag of `%s %s` (see %s %s --help)", where, name, binaryName, inv.sub, binaryName, inv.sub)
			continue
		}
		if f.value && !hasValue {
			if j+1 >= len(rest) {
				ps.add("%s: %s needs a value", where, name)
				continue
			}
			j++
			value = rest[j]
		}
		inv.flags[f.long] = value
	}
	if len(inv.positionals) > 0 && !cmd.positionals {
		ps.add("%s: `%s %s` takes no arguments, got %q", where, binaryName, inv.sub, inv.positionals)
	}
	return inv
}

// checkHealthURL checks the --url of a `delaybridge health` invocation: a
// loopback http URL whose path is wantPath, a real route.
func checkHealthURL(ps *problems, where string, inv invocation, wantPath string) *url.URL {
	raw := inv.flags["url"]
	if raw == "" {
		ps.add("%s: `delaybridge health` without --url derives it from admin.listen, which is 0.0.0.0 or [::] in a container: give --url http://127.0.0.1:PORT%s", where, wantPath)
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Port() == "" {
		ps.add("%s: --url %q: want http://127.0.0.1:PORT%s", where, raw, wantPath)
		return nil
	}
	if !isLoopback(u.Hostname()) {
		ps.add("%s: --url %q: the probe runs beside the daemon, use 127.0.0.1", where, raw)
	}
	if u.Path != wantPath {
		ps.add("%s: --url %q probes %s, want %s", where, raw, u.Path, wantPath)
	}
	checkRoute(ps, where+": --url", u.Path)
	return u
}

// checkRoute checks that GET path answers 200 on the real admin handler
// without a token, even though one is configured (probes send none).
func checkRoute(ps *problems, where, p string) {
	if code, body := adminGet(p); code != 200 {
		ps.add("%s: GET %s on the admin server answers %d, want 200 without a token: %s", where, p, code, body)
	}
}

// ---------------------------------------------------------------------------
// Configuration facts

// adminPort splits admin.listen; port is "" when the admin server is off.
func adminPort(ps *problems, where string, cfg *configFacts) (host, port string) {
	if cfg.adminListen == "" {
		return "", ""
	}
	host, port, err := net.SplitHostPort(cfg.adminListen)
	if err != nil {
		ps.add("%s: admin.listen: %v", where, err)
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

// readFile reads a deploy file, or reports that it cannot.
func readFile(ps *problems, p string) ([]byte, bool) {
	data, err := os.ReadFile(p)
	if err != nil {
		ps.add("%v", err)
		return nil, false
	}
	return data, true
}

// relTo is p relative to the deploy directory dir, for messages and
// comparisons that must not depend on where dir is.
func relTo(dir, p string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return p
	}
	if r, err := filepath.Rel(abs, p); err == nil {
		return filepath.ToSlash(r)
	}
	return p
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestHelpReader checks the reading of --help that checkInvocation relies on,
// so that a change of the help layout cannot make every command line pass.
func TestHelpReader(t *testing.T) {
	cmd, err := help("health")
	if err != nil {
		t.Fatal(err)
	}
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
	if c, err := help("inspect"); err != nil || !c.positionals {
		t.Errorf("help(inspect): %v, %v: want an ID argument allowed", c, err)
	}
	var ps problems
	checkInvocation(&ps, "test", []string{"/usr/local/bin/delaybridge", "run", "--confg=x"})
	checkInvocation(&ps, "test", []string{"/usr/local/bin/delaybridge", "runn"})
	checkInvocation(&ps, "test", []string{"/usr/local/bin/delaybridge", "health", "extra"})
	if len(ps) != 3 {
		t.Errorf("checkInvocation on three wrong command lines reported %d problems, want 3: %q", len(ps), ps)
	}
}
