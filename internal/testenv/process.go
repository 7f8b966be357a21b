package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Main runs the tests and then stops the servers shared by the test binary (the
// RabbitMQ node) and removes the binaries built by Build. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	if err := shutdownShared(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: shutting down shared servers: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func shutdownShared() error {
	var errs []string
	if rabbitNode != nil {
		if err := rabbitNode.shutdown(); err != nil {
			errs = append(errs, "rabbitmq: "+err.Error())
		}
	}
	buildMu.Lock()
	if buildDir != "" {
		if err := os.RemoveAll(buildDir); err != nil {
			errs = append(errs, "build dir: "+err.Error())
		}
		buildDir = ""
		builds = map[string]*buildResult{}
	}
	buildMu.Unlock()
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

type buildResult struct {
	once sync.Once
	path string
	err  error
}

var (
	buildMu  sync.Mutex
	buildDir string // shared by all builds of this process, removed by Main
	builds   = map[string]*buildResult{}
)

// Build builds ./cmd/delaybridge of this module (found by walking up from the working
// directory to go.mod) once per test process and returns the binary's path. See
// BuildPackage.
func Build(t testing.TB) string {
	skipShort(t, "the delaybridge binary")
	t.Helper()
	return BuildPackage(t, "./cmd/delaybridge")
}

// BuildPackage builds the main package pkg (a path relative to the module root, e.g.
// "./cmd/delaybridge") once per test process into a temp dir removed by Main, and
// returns the binary's path. When the test binary itself was built with -race, or
// RaceDaemonEnv asks for it, so is the program, and a data race the program reports
// fails the test that ran it (StartProcess). A failed build fails every test that
// asks for it, with the compiler's output.
//
// Caveat: the first build of a package embedding big dependencies takes tens of
// seconds with a cold build cache; later ones are cache hits.
func BuildPackage(t testing.TB, pkg string) string {
	skipShort(t, "the delaybridge binary")
	t.Helper()
	return buildOnce(t, pkg, nil)
}

// BuildTagged is Build with build tags: ./cmd/delaybridge built with -tags (e.g.
// "faultinject", which compiles in the test-only fault hooks), once per test process
// and set of tags, into a binary of its own beside Build's.
func BuildTagged(t testing.TB, tags ...string) string {
	skipShort(t, "the delaybridge binary")
	t.Helper()
	return buildOnce(t, "./cmd/delaybridge", tags)
}

// BuildPackageTagged is BuildPackage with build tags.
func BuildPackageTagged(t testing.TB, pkg string, tags ...string) string {
	skipShort(t, "the delaybridge binary")
	t.Helper()
	return buildOnce(t, pkg, tags)
}

func buildOnce(t testing.TB, pkg string, tags []string) string {
	t.Helper()
	key := pkg + " -tags=" + strings.Join(tags, ",")
	return onceFor(t, key, func() (string, error) { return build(pkg, tags) })
}

// onceFor runs do once per test process for key (a build) and returns
// its path, failing the test with its error.
func onceFor(t testing.TB, key string, do func() (string, error)) string {
	t.Helper()
	buildMu.Lock()
	b, ok := builds[key]
	if !ok {
		b = &buildResult{}
		builds[key] = b
	}
	buildMu.Unlock()
	b.once.Do(func() { b.path, b.err = do() })
	if b.err != nil {
		t.Fatalf("testenv: build %s: %v", key, b.err)
	}
	return b.path
}

// PrebuiltEnv names a directory of daemons built before the tests, which
// Build uses instead of building its own: make test builds the race ones
// once for every test binary of the root module (a race link is 6-7 CPU-s,
// and five test binaries each linked their own). A binary is taken only
// under the name prebuiltName gives (race or not, its tags); any other is
// built as usual. The tests trust it to be built from the sources they
// test: only the Makefile sets it.
const PrebuiltEnv = "DELAYBRIDGE_TEST_BIN"

// RaceDaemonEnv, set to 1, has the programs Build makes built with -race
// though the test binary is not. make test runs the black-box packages
// (test/...) so: their own code is the harness, and the race detector in
// it, with the NATS server and Kafka it embeds, cost test/e2e 57 of its 207
// CPU-s, while the daemon it drives keeps the detector.
const RaceDaemonEnv = "DELAYBRIDGE_TEST_RACE_DAEMON"

// raceDaemon reports whether Build and BuildCommit build with -race.
func raceDaemon() bool { return raceEnabled || os.Getenv(RaceDaemonEnv) == "1" }

// prebuiltName is the file name of ./cmd/delaybridge built with tags,
// with -race when race, in PrebuiltEnv's directory.
func prebuiltName(race bool, tags []string) string {
	name := "delaybridge"
	if race {
		name += "-race"
	}
	for _, tag := range tags {
		name += "-" + tag
	}
	return name
}

func build(pkg string, tags []string) (string, error) {
	if dir := os.Getenv(PrebuiltEnv); dir != "" && pkg == "./cmd/delaybridge" {
		if p := filepath.Join(dir, prebuiltName(raceDaemon(), tags)); fileExists(p) {
			return p, nil
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	dir, err := sharedBuildDir()
	if err != nil {
		return "", err
	}
	name := filepath.Base(filepath.Clean(pkg))
	if len(tags) > 0 {
		name += "-" + strings.Join(tags, "-")
	}
	out := filepath.Join(dir, name)
	for i := 2; fileExists(out); i++ { // two packages with the same base name
		out = filepath.Join(dir, fmt.Sprintf("%s-%d", name, i))
	}
	args := []string{"build", "-o", out}
	if raceDaemon() {
		args = append(args, "-race")
	}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, pkg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s (in %s): %v\n%s", strings.Join(args, " "), root, err, output)
	}
	return out, nil
}

// sharedBuildDir is the directory of every binary this process builds
// (Build, BuildCommit), created on first use and removed by Main.
func sharedBuildDir() (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir == "" {
		dir, err := mkProcessTempDir("testenv-build-")
		if err != nil {
			return "", err
		}
		buildDir = dir
	}
	return buildDir, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ProcessOptions tunes StartProcessWith.
type ProcessOptions struct {
	Env []string // appended to the test process's environment (later entries win)
	Dir string   // working directory; "" means the test's working directory
}

// Process is a program started by StartProcess. Its output (stdout and stderr
// interleaved) goes to OutputPath.
type Process struct {
	Pid        int
	OutputPath string

	t    testing.TB
	proc *child
}

// StartProcess runs bin with args in its own process group, stdout and stderr captured
// to a file in t.TempDir() (see Output). At test end the process group is killed
// (SIGKILL) if still running, and if the test failed the output's tail is logged.
// The process also dies with the test binary (parent-death signal SIGKILL).
func StartProcess(t testing.TB, bin string, args ...string) *Process {
	t.Helper()
	return StartProcessWith(t, ProcessOptions{}, bin, args...)
}

// StartProcessWith is StartProcess with extra environment and a working directory.
func StartProcessWith(t testing.TB, opts ProcessOptions, bin string, args ...string) *Process {
	t.Helper()
	outPath := filepath.Join(t.TempDir(), filepath.Base(bin)+".out")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = opts.Dir
	if len(opts.Env) > 0 {
		cmd.Env = append(os.Environ(), opts.Env...)
	}
	proc, err := startWatched(cmd, syscall.SIGKILL)
	if err != nil {
		t.Fatalf("testenv: start %s: %v", bin, err)
	}
	p := &Process{Pid: cmd.Process.Pid, OutputPath: outPath, t: t, proc: proc}
	t.Cleanup(func() {
		if !proc.exited() {
			killGroup(p.Pid, syscall.SIGKILL)
			if !proc.waitExit(10 * time.Second) {
				t.Errorf("testenv: %s (pid %d) did not exit after SIGKILL", bin, p.Pid)
			}
		} else {
			killGroup(p.Pid, syscall.SIGKILL) // children it may have left in its group
		}
		if report := raceReport(p.Output()); report != "" {
			t.Errorf("testenv: %s (pid %d) reported a data race:\n%s", filepath.Base(bin), p.Pid, report)
		}
		if t.Failed() {
			t.Logf("testenv: output of %s %s (tail):\n%s", filepath.Base(bin), strings.Join(args, " "), tail(outPath, 4000))
		}
	})
	return p
}

// raceWarning begins each report of the race detector in a program built
// with -race. The program goes on after it (and exits 66 only if it ends
// on its own), so StartProcess looks for it in the output at the test's
// end: most daemons under test are killed, not stopped.
const raceWarning = "WARNING: DATA RACE"

// raceReport returns the first data race report in out, up to 8000 bytes,
// or "" when there is none.
func raceReport(out string) string {
	i := strings.Index(out, raceWarning)
	if i < 0 {
		return ""
	}
	return out[i:min(len(out), i+8000)]
}

// Output returns everything the process wrote so far.
func (p *Process) Output() string {
	b, err := os.ReadFile(p.OutputPath)
	if err != nil {
		return fmt.Sprintf("(cannot read output: %v)", err)
	}
	return string(b)
}

// WaitOutput waits until the output contains substr, failing the test after timeout
// or if the process exits first.
func (p *Process) WaitOutput(timeout time.Duration, substr string) {
	p.t.Helper()
	ok := Poll(timeout, func() bool { return strings.Contains(p.Output(), substr) || p.proc.exited() })
	if ok && strings.Contains(p.Output(), substr) {
		return
	}
	if p.proc.exited() {
		p.t.Fatalf("testenv: process %d exited (%v) before printing %q; output:\n%s", p.Pid, p.proc.err, substr, tail(p.OutputPath, 4000))
	}
	p.t.Fatalf("testenv: process %d did not print %q within %v; output:\n%s", p.Pid, substr, timeout, tail(p.OutputPath, 4000))
}

// Signal sends sig to the process (not its group).
func (p *Process) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.proc.cmd.Process.Signal(sig); err != nil && !p.proc.exited() {
		p.t.Fatalf("testenv: signal %v to %d: %v", sig, p.Pid, err)
	}
}

// Kill sends SIGKILL to the process group and waits (up to 10 s) for the process.
func (p *Process) Kill() {
	p.t.Helper()
	killGroup(p.Pid, syscall.SIGKILL)
	if !p.proc.waitExit(10 * time.Second) {
		p.t.Fatalf("testenv: process %d did not exit after SIGKILL", p.Pid)
	}
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool { return p.proc.exited() }

// Done returns a channel closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.proc.done }

// Wait waits up to timeout for the process to exit and returns its exit code (-1 if a
// signal killed it). It fails the test if the process is still running at timeout.
func (p *Process) Wait(timeout time.Duration) int {
	p.t.Helper()
	if !p.proc.waitExit(timeout) {
		p.t.Fatalf("testenv: process %d still running after %v; output tail:\n%s", p.Pid, timeout, tail(p.OutputPath, 4000))
	}
	return p.proc.cmd.ProcessState.ExitCode()
}
