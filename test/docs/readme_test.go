package docs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// step is one command of a console block and the output it must print.
type step struct {
	where  string // README.md:LINE
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
				out = append(out, step{where: fmt.Sprintf("%s:%d", file, b.line+1+i), cmd: cmd})
				continue
			}
			if len(out) > 0 && (strings.TrimSpace(l) != "" || len(out[len(out)-1].expect) > 0) {
				out[len(out)-1].expect = append(out[len(out)-1].expect, l)
			}
		}
	}
	return out
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

// The README's examples are written against `delaybridge dev`, and every
// one runs: the commands of its console blocks, verbatim and in order, in
// the directory where dev runs, each in bash after every `export` and `.`
// line before it, with the delaybridge of this checkout on the PATH. What
// each prints (stdout and stderr) must match the lines below it; a command
// whose answer depends on the daemon having read a message (sent to the
// ingest a moment before) is tried again until it matches, for up to 10 s.
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

	steps := consoleSteps("README.md", read(t, "README.md"))
	if len(steps) < 20 {
		t.Fatalf("found only %d commands in the README's console blocks", len(steps))
	}
	var prelude []string
	for _, s := range steps {
		want := outputPattern(s.expect)
		script := strings.Join(append(append([]string{"set -o pipefail"}, prelude...), s.cmd), "\n")
		var got string
		var err error
		ok := testenv.Poll(10*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := exec.CommandContext(ctx, "bash", "-c", script)
			c.Dir = work
			c.Env = append(os.Environ(), path)
			var b []byte
			b, err = c.CombinedOutput()
			got = string(b)
			return err == nil && want.MatchString(normalize(got))
		})
		if !ok {
			t.Fatalf("%s: $ %s\nexit: %v\nprinted:\n%s\nthe README says:\n%s", s.where, s.cmd, err, got, strings.Join(s.expect, "\n"))
		}
		if strings.HasPrefix(s.cmd, "export ") || strings.HasPrefix(s.cmd, ". ") {
			prelude = append(prelude, s.cmd)
		}
	}
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
