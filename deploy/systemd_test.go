package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/coreos/go-systemd/v22/unit"
)

const (
	systemdUnit = "systemd/delaybridge.service"
	systemdEnv  = "systemd/delaybridge.env.example"
	// installedBinary is where the unit runs the binary from (deploy/README.md).
	installedBinary = "/usr/local/bin/" + binaryName
)

// systemdAnalyze is Debian's systemd-analyze (package systemd, which
// scripts/test-deps.sh installs).
func systemdAnalyze(ps *problems) string {
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		ps.add("systemd-analyze not found (%v): install Debian's systemd package (make deps)", err)
		return ""
	}
	return p
}

// verifyUnit runs `systemd-analyze verify` on a copy of the unit. verify
// refuses a unit whose ExecStart binary does not exist, and a test machine
// has no /usr/local/bin/delaybridge, so the copy runs an empty executable
// stub in a temp dir instead: verify only checks that the path is an
// executable. (The command line itself is checked against the real binary's
// --help by checkInvocation.) systemd exits 0 on an unknown key or a value it
// cannot parse and only warns, so any output is a problem.
func verifyUnit(ps *problems, file string) {
	analyze := systemdAnalyze(ps)
	data, ok := readFile(ps, file)
	if analyze == "" || !ok {
		return
	}
	tmp, err := os.MkdirTemp("", "deploy-systemd-")
	if err != nil {
		ps.add("%v", err)
		return
	}
	defer os.RemoveAll(tmp)
	stub := filepath.Join(tmp, binaryName)
	copied := filepath.Join(tmp, filepath.Base(file))
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		ps.add("%v", err)
		return
	}
	if err := os.WriteFile(copied, bytes.ReplaceAll(data, []byte(installedBinary), []byte(stub)), 0o644); err != nil {
		ps.add("%v", err)
		return
	}
	out, err := exec.Command(analyze, "verify", "--man=no", copied).CombinedOutput()
	msg := strings.TrimSpace(strings.ReplaceAll(string(out), copied, file))
	if err != nil || msg != "" {
		status := "exit 0, with warnings"
		if err != nil {
			status = err.Error()
		}
		ps.add("%s: systemd-analyze verify (%s):\n%s", file, status, msg)
	}
}

// timespan parses a systemd time span with systemd's own parser.
func timespan(analyze, value string) (time.Duration, error) {
	out, err := exec.Command(analyze, "timespan", value).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("systemd-analyze timespan %q: %v: %s", value, err, strings.TrimSpace(string(out)))
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "μs:"); ok {
			us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Duration(us) * time.Microsecond, err
		}
	}
	return 0, fmt.Errorf("systemd-analyze timespan %q printed no μs: line: %s", value, out)
}

// checkSystemd checks dir/systemd against systemd and the code.
func checkSystemd(dir string) problems {
	var ps problems
	file := filepath.Join(dir, systemdUnit)
	verifyUnit(&ps, file)
	data, ok := readFile(&ps, file)
	if !ok {
		return ps
	}
	opts, err := unit.DeserializeOptions(bytes.NewReader(data))
	if err != nil {
		ps.add("%s: %v", file, err)
		return ps
	}
	values := func(key string) []string {
		var out []string
		for _, o := range opts {
			if o.Section == "Service" && o.Name == key {
				out = append(out, o.Value)
			}
		}
		return out
	}
	last := func(key string) string {
		v := values(key)
		if len(v) == 0 {
			return ""
		}
		return v[len(v)-1]
	}

	// The command lines.
	if n := len(values("ExecStart")); n != 1 {
		ps.add("%s: want one ExecStart, got %d", file, n)
	}
	for _, key := range []string{"ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop"} {
		for _, line := range values(key) {
			where := fmt.Sprintf("%s: %s=%s", file, key, line)
			argv := strings.Fields(strings.TrimLeft(line, "-@:+!"))
			if len(argv) > 0 && argv[0] != installedBinary {
				ps.add("%s: runs %s, want %s (where deploy/README.md installs it)", where, argv[0], installedBinary)
			}
			inv := checkInvocation(&ps, where, argv)
			if key == "ExecStart" && inv.sub != "run" {
				ps.add("%s: runs %q, want run", where, inv.sub)
			}
			if inv.sub == "run" || inv.sub == "validate" {
				if cfg := inv.flags["config"]; !filepath.IsAbs(cfg) {
					ps.add("%s: --config %q: want an absolute path", where, cfg)
				}
			}
		}
	}

	// Stopping: SIGTERM, and time for the shutdown rule. The unit runs the
	// operator's configuration: hold it to the default shutdown_timeout and
	// to config.example.yaml's.
	if s := last("KillSignal"); s != "SIGTERM" && s != "" {
		ps.add("%s: KillSignal=%s: delaybridge stops gracefully on SIGTERM", file, s)
	}
	raw := last("TimeoutStopSec")
	analyze := systemdAnalyze(&ps)
	if raw == "" {
		ps.add("%s: no TimeoutStopSec: set it (systemd's default comes from the host's system.conf)", file)
	} else if analyze != "" {
		stop, err := timespan(analyze, raw)
		if err != nil {
			ps.add("%s: TimeoutStopSec=%s: %v", file, raw, err)
		} else {
			where := fmt.Sprintf("%s: TimeoutStopSec=%s", file, raw)
			checkGrace(&ps, where, stop, "the default", defaultShutdownTimeout())
			if example, ok := readFile(&ps, filepath.Join(repoRoot, "config.example.yaml")); ok {
				env := loadEnvFile(&ps, filepath.Join(dir, systemdEnv))
				cfg, cfgProblems := loadConfig(example, env)
				ps.addAll("config.example.yaml (with "+systemdEnv+")", cfgProblems)
				if cfg != nil {
					checkGrace(&ps, where, stop, "config.example.yaml", cfg.shutdownTimeout)
				}
			}
		}
	}

	// Hardening.
	for key, want := range map[string][]string{
		"Restart":         {"on-failure", "always"},
		"NoNewPrivileges": {"yes", "true"},
		"ProtectSystem":   {"strict"},
	} {
		if got := last(key); !slices.Contains(want, got) {
			ps.add("%s: %s=%q, want one of %v", file, key, got, want)
		}
	}
	if dyn, user := last("DynamicUser"), last("User"); dyn != "yes" && dyn != "true" && (user == "" || user == "root" || user == "0") {
		ps.add("%s: runs as root: set DynamicUser=yes or User= an unprivileged user", file)
	}
	if len(values("EnvironmentFile")) == 0 {
		ps.add("%s: no EnvironmentFile: the secrets of ${VAR} would have to be in the configuration", file)
	}
	return ps
}

func TestSystemd(t *testing.T) { checkSystemd(".").report(t) }

// loadEnvFile reads an EnvironmentFile. Its KEY=value lines are the subset of
// the dotenv format that systemd and compose agree on, read here with
// compose-go's dotenv parser.
func loadEnvFile(ps *problems, file string) map[string]string {
	data, ok := readFile(ps, file)
	if !ok {
		return nil
	}
	env, err := dotenv.UnmarshalBytesWithLookup(data, nil)
	if err != nil {
		ps.add("%s: %v", file, err)
	}
	return env
}
