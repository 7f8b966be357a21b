package docs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/cli"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestMain stops the servers the tests share (the RabbitMQ node of "Run it
// for real") and removes the binaries they built.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// step is one command of a console block and the output it must print.
type step struct {
	where  string // FILE:LINE
	line   int    // LINE
	cmd    string
	expect []string
}

// consoleSteps are the commands of every `console` block of text, in
// order: a line "$ CMD" is a command, the lines below it up to the next
// command are its output.
func consoleSteps(file, text string) []step {
	var out []step
	for _, b := range blocks(file, text) {
		if b.info != "console" {
			continue
		}
		for i, l := range strings.Split(b.text, "\n") {
			if cmd, ok := strings.CutPrefix(l, "$ "); ok {
				n := b.line + 1 + i
				out = append(out, step{where: fmt.Sprintf("%s:%d", file, n), line: n, cmd: cmd})
				continue
			}
			if len(out) > 0 && (strings.TrimSpace(l) != "" || len(out[len(out)-1].expect) > 0) {
				out[len(out)-1].expect = append(out[len(out)-1].expect, l)
			}
		}
	}
	return out
}

// sectionLines is the span [from, to) of 1-based lines of the section of
// text under the heading "## title" (to the next "## " heading); 0, 0 if
// there is none.
func sectionLines(text, title string) (from, to int) {
	lines := strings.Split(text, "\n")
	inFence := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(l, "## ") {
			continue
		}
		if from > 0 {
			return from, i + 1
		}
		if strings.TrimSpace(strings.TrimPrefix(l, "## ")) == title {
			from = i + 1
		}
	}
	if from > 0 {
		return from, len(lines) + 1
	}
	return 0, 0
}

var rfc3339 = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)

// outputPattern is the regular expression an expected output stands for:
// a time is any time, "..." any text, a line "..." any lines; trailing
// blanks and empty lines at the end do not count.
func outputPattern(expect []string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`^`)
	for len(expect) > 0 && strings.TrimSpace(expect[len(expect)-1]) == "" {
		expect = expect[:len(expect)-1]
	}
	for _, l := range expect {
		l = strings.TrimRight(l, " \t")
		if l == "..." {
			b.WriteString(`(?:[^\n]*\n)*?`)
			continue
		}
		q := regexp.QuoteMeta(rfc3339.ReplaceAllString(l, "<time>"))
		q = strings.ReplaceAll(q, `\.\.\.`, `.*`)
		b.WriteString(q + `\n`)
	}
	b.WriteString(`$`)
	return regexp.MustCompile(b.String())
}

// normalize is output as it is compared: times replaced, trailing blanks
// and empty lines at the end dropped.
func normalize(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n \t"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(rfc3339.ReplaceAllString(l, "<time>"), " \t")
	}
	if len(lines) == 1 && lines[0] == "" {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

// console runs steps as the documentation's examples run: each command in
// bash in dir, after every `export` and `.` line before it, with env added
// to the environment; what it prints (stdout and stderr) must match the
// lines below it, and a command is tried again until it does, for up to
// 30 s (an answer that depends on the daemon having read a message sent a
// moment before, or having fired it). run, when not nil, runs a command itself instead of bash
// when it says so (handled).
func console(t *testing.T, dir string, env []string, steps []step, run func(cmd string) (out string, err error, handled bool)) {
	t.Helper()
	var prelude []string
	for _, s := range steps {
		want := outputPattern(s.expect)
		script := strings.Join(append(append([]string{"set -o pipefail"}, prelude...), s.cmd), "\n")
		var got string
		var err error
		ok := testenv.Poll(30*time.Second, func() bool {
			if run != nil {
				var handled bool
				if got, err, handled = run(s.cmd); handled {
					return err == nil && want.MatchString(normalize(got))
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := exec.CommandContext(ctx, "bash", "-c", script)
			c.Dir = dir
			c.Env = append(os.Environ(), env...)
			var b []byte
			b, err = c.CombinedOutput()
			got = string(b)
			return err == nil && want.MatchString(normalize(got))
		})
		if !ok {
			t.Fatalf("%s: $ %s\nexit: %v\nprinted:\n%s\nthe documentation says:\n%s", s.where, s.cmd, err, got, strings.Join(s.expect, "\n"))
		}
		if strings.HasPrefix(s.cmd, "export ") || strings.HasPrefix(s.cmd, ". ") {
			prelude = append(prelude, s.cmd)
		}
	}
}

// devExamples are the files whose console blocks run against one `dev`,
// in this order: the README's first, then the guide that goes on from it.
var devExamples = []string{"README.md", "docs/guide.md"}

// The examples of the README and of docs/guide.md are written against
// `delaybridge dev`, and every one runs: the commands of their console
// blocks, verbatim and in order, in the directory where dev runs, with the
// delaybridge of this checkout on the PATH (see console). The README's "Run
// it for real" is not written against dev: TestRunItForReal runs it.
func TestReadmeExamplesRunAgainstDev(t *testing.T) {
	bin := testenv.Build(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is not installed (the README's admin API examples use it): run make deps")
	}
	binDir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(binDir, "delaybridge")); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	path := "PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH")
	dev := testenv.StartProcessWith(t, testenv.ProcessOptions{Dir: work, Env: []string{path}}, bin, "dev")
	dev.WaitOutput(60*time.Second, "Ctrl-C stops everything")
	// Once the welcome message has fired nothing is parked but what the
	// examples park.
	dev.WaitOutput(30*time.Second, `body="hello from delaybridge"`)

	var steps []step
	for _, file := range devExamples {
		text := read(t, file)
		from, to := sectionLines(text, runItForReal)
		var own []step
		for _, s := range consoleSteps(file, text) {
			if file == "README.md" && s.line >= from && s.line < to {
				continue
			}
			own = append(own, s)
		}
		if min := map[string]int{"README.md": 2, "docs/guide.md": 20}[file]; len(own) < min {
			t.Fatalf("found only %d commands in the console blocks of %s that run against dev", len(own), file)
		}
		steps = append(steps, own...)
	}
	console(t, work, []string{path}, steps, nil)
	// "Try it": the message sent with --delay 3s is printed by dev when it fires.
	dev.WaitOutput(30*time.Second, `body="hello again"`)
}

// The matching the README test does, on its own.
func TestOutputPattern(t *testing.T) {
	cases := []struct {
		expect []string
		out    string
		match  bool
	}{
		{[]string{"sent order-42, due 2026-12-01T10:30:00.000Z (in 30m0s)"}, "sent order-42, due 2031-01-02T03:04:05.678Z (in 30m0s)\n", true},
		{[]string{"sent ... to ingest dev"}, "sent 01a2-b to ingest dev\n", true},
		{[]string{"{", "...", "}"}, "{\n  \"a\": 1,\n  \"b\": 2\n}\n", true},
		{[]string{"{", "  \"size\": ...", "}"}, "{\n  \"size\": 62\n}\n", true},
		{[]string{"exit 1"}, "exit 2\n", false},
		{[]string{"a"}, "a\nb\n", false},
		{nil, "", true},
		{[]string{"a", ""}, "a  \n\n", true},
	}
	for _, c := range cases {
		if got := outputPattern(c.expect).MatchString(normalize(c.out)); got != c.match {
			t.Errorf("%q against %q: %v, want %v", c.expect, c.out, got, c.match)
		}
	}
}

// runItForReal is the README's section on a deployment apart from dev.
const runItForReal = "Run it for real"

// The README is a front door: short, the two commands first, a first
// message, a real deployment, and where the rest is.
func TestReadmeIsAFrontDoor(t *testing.T) {
	text := read(t, "README.md")
	if n := strings.Count(strings.TrimRight(text, "\n"), "\n") + 1; n >= 250 {
		t.Errorf("README.md has %d lines: keep it under 250 (details go to docs/, with a link)", n)
	}
	bs := blocks("README.md", text)
	if len(bs) == 0 || bs[0].info != "sh" {
		t.Fatal("README.md does not open with a ```sh block of the two commands")
	}
	var first []string
	for _, l := range strings.Split(bs[0].text, "\n") {
		cmd, _, _ := strings.Cut(l, "#")
		first = append(first, strings.TrimSpace(cmd))
	}
	if want := []string{"go run ./cmd/delaybridge dev", "make test"}; !slices.Equal(first, want) {
		t.Errorf("README.md's first block runs %q, want the quickstart and the test command, %q", first, want)
	}
	for _, h := range []string{"What it is", "Try it", "The guarantee, in plain words", runItForReal, "Where the rest is"} {
		if from, _ := sectionLines(text, h); from == 0 {
			t.Errorf("README.md has no section %q", h)
		}
	}
	// Where the rest is: each of these is linked from the README.
	want := []string{"docs/guide.md", "docs/reference.md", "docs/how-it-works.md", "docs/operations.md",
		"docs/security.md", "docs/performance.md", "docs/store.md", "docs/reliability.md",
		"docs/observability.md", "docs/development.md", "deploy/README.md"}
	migrations, err := filepath.Glob(filepath.Join(root(t), "docs", "migrate-*.md"))
	if err != nil || len(migrations) == 0 {
		t.Fatalf("no docs/migrate-*.md: %v", err)
	}
	for _, m := range migrations {
		want = append(want, "docs/"+filepath.Base(m))
	}
	for _, w := range want {
		if !strings.Contains(text, "]("+w+")") && !strings.Contains(text, "]("+w+"#") {
			t.Errorf("README.md does not link %s", w)
		}
	}
}

// shCommands are the commands of the ```sh blocks of text: a line each
// (a trailing "\" continues it), comments dropped, split at &&, || and ;.
func shCommands(bs []block) []string {
	var out []string
	for _, b := range bs {
		if b.info != "sh" {
			continue
		}
		joined := strings.ReplaceAll(b.text, "\\\n", " ")
		for _, l := range strings.Split(joined, "\n") {
			if i := strings.Index(l, " #"); i >= 0 {
				l = l[:i]
			}
			for _, c := range regexp.MustCompile(`&&|\|\||;`).Split(l, -1) {
				if c = strings.TrimSpace(c); c != "" && !strings.HasPrefix(c, "#") {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// checkDelaybridgeCommand fails unless args (after "delaybridge") name a
// real command and only flags its --help lists.
func checkDelaybridgeCommand(t *testing.T, bin, where string, args []string) {
	t.Helper()
	help := func(path []string) (string, bool) {
		out, err := exec.Command(bin, append(append([]string{}, path...), "--help")...).CombinedOutput()
		usage := regexp.MustCompile(`(?m)^Usage:\n  (.*)$`).FindStringSubmatch(string(out))
		if err != nil || usage == nil {
			return "", false
		}
		name := "delaybridge " + strings.Join(path, " ")
		return string(out), usage[1] == name || strings.HasPrefix(usage[1], name+" ")
	}
	var path []string
	var text string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			break
		}
		out, ok := help(append(append([]string{}, path...), a))
		if !ok {
			break
		}
		path, text = append(path, a), out
	}
	if len(path) == 0 {
		t.Errorf("%s: delaybridge %s: no such command", where, strings.Join(args, " "))
		return
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		flag, _, _ := strings.Cut(a, "=")
		if !regexp.MustCompile(`(?m)^\s+(-[a-zA-Z], )?`+regexp.QuoteMeta(flag)+`\b`).MatchString(text) &&
			!regexp.MustCompile(`(?m)^\s+`+regexp.QuoteMeta(flag)+`, --`).MatchString(text) {
			t.Errorf("%s: delaybridge %s: %s has no flag %s", where, strings.Join(args, " "), strings.Join(path, " "), flag)
		}
	}
}

// The README's "Run it for real" works as printed: its configuration is a
// whole one that validates; its sh blocks run real commands of delaybridge
// with real flags, install files that exist, and put the configuration
// where the systemd unit and the container image read it; and its console
// block runs against a delaybridge started as the unit starts it, with a
// throwaway Redis with AOF and RabbitMQ in place of the system's (their
// addresses, the admin port and the configuration's path put in for the
// README's; the sink's queue declared as its rabbitmqadmin line does).
func TestRunItForReal(t *testing.T) {
	text := read(t, "README.md")
	from, to := sectionLines(text, runItForReal)
	if from == 0 {
		t.Fatalf("README.md has no section %q", runItForReal)
	}
	var section []block
	for _, b := range blocks("README.md", text) {
		if b.line >= from && b.line < to {
			section = append(section, b)
		}
	}
	var yamls []block
	for _, b := range section {
		if b.info == "yaml" {
			yamls = append(yamls, b)
		}
	}
	if len(yamls) != 1 {
		t.Fatalf("%q has %d yaml blocks, want the one configuration", runItForReal, len(yamls))
	}
	conf := yamls[0]
	if strings.HasPrefix(strings.TrimSpace(conf.text), fragmentMark) {
		t.Fatalf("README.md:%d: the configuration of %q is a fragment: give a whole one", conf.line, runItForReal)
	}
	var errOut bytes.Buffer
	printed := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(printed, []byte(conf.text), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := cli.Main([]string{"validate", printed}, strings.NewReader(""), io.Discard, &errOut); code != 0 {
		t.Fatalf("README.md:%d: the configuration does not pass validate:\n%s", conf.line, errOut.String())
	}
	var cfg struct {
		Redis  struct{ Addr string }
		Admin  struct{ Listen string }
		Ingest []map[string]any
		Sinks  []map[string]any
	}
	if err := yaml.Unmarshal([]byte(conf.text), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Addr == "" || cfg.Admin.Listen == "" || len(cfg.Ingest) != 1 || len(cfg.Sinks) != 1 {
		t.Fatalf("README.md:%d: want redis.addr, admin.listen, one ingest and one sink: %+v", conf.line, cfg)
	}
	_, rabbitIn := cfg.Ingest[0]["rabbitmq"]
	_, rabbitOut := cfg.Sinks[0]["rabbitmq"]
	if !rabbitIn || !rabbitOut {
		t.Fatalf("README.md:%d: this test runs a RabbitMQ ingest and sink; the configuration has %v and %v", conf.line, cfg.Ingest[0], cfg.Sinks[0])
	}

	// The sh blocks.
	const etc = "/etc/delaybridge/config.yaml"
	cmds := shCommands(section)
	joined := strings.Join(cmds, "\n")
	for _, want := range []string{
		"appendonly yes",                        // Redis with AOF
		"install -D -m 0644 config.yaml " + etc, // where the unit and the image read it
		"systemctl enable --now delaybridge",
		":" + etc + ":ro", // the container's mount
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("the sh blocks of %q do not say %q", runItForReal, want)
		}
	}
	unit := read(t, "deploy/systemd/delaybridge.service")
	if !strings.Contains(unit, "ExecStart=/usr/local/bin/delaybridge run --config "+etc+"\n") {
		t.Errorf("deploy/systemd/delaybridge.service does not run delaybridge run --config %s, where %q installs the configuration", etc, runItForReal)
	}
	if !strings.Contains(unit, "EnvironmentFile=-/etc/delaybridge/delaybridge.env") || !strings.Contains(joined, "/etc/delaybridge/delaybridge.env") {
		t.Errorf("%q and the systemd unit do not name the same environment file, /etc/delaybridge/delaybridge.env", runItForReal)
	}
	if env := read(t, "deploy/systemd/delaybridge.env.example"); !strings.Contains(env, "DELAYBRIDGE_ADMIN_TOKEN=") {
		t.Errorf("deploy/systemd/delaybridge.env.example does not set DELAYBRIDGE_ADMIN_TOKEN, which %q says to set there", runItForReal)
	}
	if !strings.Contains(read(t, "deploy/Dockerfile"), etc) {
		t.Errorf("deploy/Dockerfile does not read %s, where %q mounts the configuration", etc, runItForReal)
	}
	for _, f := range regexp.MustCompile(`\bdeploy/[A-Za-z0-9_./-]*[A-Za-z0-9_]`).FindAllString(joined, -1) {
		if _, err := os.Stat(filepath.Join(root(t), f)); err != nil {
			t.Errorf("the sh blocks of %q name %s, which does not exist", runItForReal, f)
		}
	}
	bin := testenv.Build(t)
	queue := ""
	var validateLive []string
	for _, c := range cmds {
		c = strings.TrimPrefix(c, "sudo ")
		f := strings.Fields(c)
		switch {
		case f[0] == "delaybridge" || f[0] == "/usr/local/bin/delaybridge":
			checkDelaybridgeCommand(t, bin, "README.md, "+runItForReal, f[1:])
			if len(f) > 1 && f[1] == "validate" {
				validateLive = f[1:]
			}
		case f[0] == "rabbitmqadmin" && len(f) > 2 && f[1] == "declare" && f[2] == "queue":
			for _, a := range f[3:] {
				if v, ok := strings.CutPrefix(a, "name="); ok {
					queue = v
				}
			}
		}
	}
	if queue == "" {
		t.Fatalf("the sh blocks of %q declare no queue with rabbitmqadmin", runItForReal)
	}
	if !slices.Contains(validateLive, "--live") {
		t.Errorf("the sh blocks of %q do not check the configuration with delaybridge validate --live", runItForReal)
	}
	if t.Failed() {
		return
	}

	// The console block, against a daemon started as the unit starts it.
	for _, tool := range []string{"bash", "curl", "redis-cli"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (%q uses it): run make deps", tool, runItForReal)
		}
	}
	redis := testenv.Redis(t) // appendonly yes, as the README sets it
	rabbit := testenv.RabbitMQ(t)
	conn, err := amqp.Dial(rabbit.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ingestQueue, _ := cfg.Ingest[0]["rabbitmq"].(map[string]any)["queue"].(string)
	for _, q := range []string{queue, ingestQueue} { // what an earlier run in this node left
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	put := strings.NewReplacer(
		"amqp://guest:guest@127.0.0.1:5672/", rabbit.URL,
		cfg.Redis.Addr, redis.Addr,
		cfg.Admin.Listen, admin,
	)
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte(put.Replace(conf.text)), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := put.Replace(conf.text); !strings.Contains(c, rabbit.URL) || !strings.Contains(c, redis.Addr) || !strings.Contains(c, admin) {
		t.Fatalf("README.md:%d: the configuration's addresses are not the ones this test replaces (127.0.0.1:6379, amqp://guest:guest@127.0.0.1:5672/, %s):\n%s", conf.line, cfg.Admin.Listen, c)
	}
	args := append([]string{}, validateLive...)
	for i, a := range args {
		if a == "config.yaml" {
			args[i] = config
		}
	}
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil || !strings.Contains(string(out), "AOF on") || strings.Contains(string(out), "warning") {
		t.Fatalf("delaybridge %s: want it valid, with AOF on and no warning: %v\n%s", strings.Join(args, " "), err, out)
	}
	binDir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(binDir, "delaybridge")); err != nil {
		t.Fatal(err)
	}
	pathEnv := "PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH")
	// As the unit runs it, with the token its environment file sets.
	testenv.StartProcessWith(t, testenv.ProcessOptions{Dir: dir, Env: []string{pathEnv, "DELAYBRIDGE_ADMIN_TOKEN=run-it-for-real"}},
		bin, "run", "--config", config)
	t.Cleanup(func() {
		if t.Failed() { // what the daemon had read, parked and published by then
			t.Logf("the daemon's counters at the end:\n%s", counters(admin, "run-it-for-real",
				"delaybridge_ingest_", "delaybridge_park_batch_size_count", "delaybridge_sink_published_total", "delaybridge_fire_lateness_seconds_count", "delaybridge_parked_messages"))
		}
	})

	var steps []step
	for _, s := range consoleSteps("README.md", text) {
		if s.line < from || s.line >= to {
			continue
		}
		s.cmd = strings.NewReplacer(etc, config, cfg.Admin.Listen, admin, "redis-cli ", "redis-cli -p "+strconv.Itoa(redis.Port)+" ").Replace(s.cmd)
		steps = append(steps, s)
	}
	if len(steps) < 4 {
		t.Fatalf("%q has only %d console commands: probe the daemon, send a message and see it arrive", runItForReal, len(steps))
	}
	console(t, dir, []string{pathEnv}, steps, func(cmd string) (string, error, bool) {
		rest, ok := strings.CutPrefix(cmd, "sudo rabbitmqctl ")
		if !ok {
			if strings.HasPrefix(cmd, "sudo ") {
				return "", fmt.Errorf("this test runs no sudo but sudo rabbitmqctl"), true
			}
			return "", nil, false
		}
		out := rabbit.Ctl(t, strings.Fields(rest)...)
		return out, nil, true
	})
}

// counters returns the lines of the daemon's /metrics at admin (its token
// given) that begin with one of prefixes, or why there are none.
func counters(admin, token string, prefixes ...string) string {
	req, err := http.NewRequest(http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req) // a hung daemon does not hold the test
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	if len(out) == 0 {
		return fmt.Sprintf("(none of %v in %s's answer, %s)", prefixes, admin, resp.Status)
	}
	return strings.Join(out, "\n")
}
