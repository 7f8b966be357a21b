package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/cli"
)

// A snippet that is not a whole configuration says so on its first line,
// with a comment that starts with "# fragment". The test completes it in one
// way: each of the keys redis: and sinks: that it does not have is taken
// from fragmentBase, so a fragment's routes name the sink "out". A snippet
// whose first line starts with "# not a delaybridge configuration" is not
// checked.
const (
	fragmentMark = "# fragment"
	notConfig    = "# not a delaybridge configuration"
	fragmentBase = `redis: {addr: "127.0.0.1:6379"}
sinks: [{name: out, nats: {url: "nats://127.0.0.1:4222", jetstream: true}}]
`
)

// testValue is what every ${VAR} a snippet names is set to, as a
// deployment would have them set: 32 bytes in standard base64, so that it
// is a valid password, token and encryption key alike.
const testValue = "ZGVsYXlicmlkZ2UtZG9jcy10ZXN0LWtleS0zMmJ5dGU="

// waitingForTheirOwner are snippets of docs another change is rewriting,
// which cannot pass as printed yet; each must fail (the test says when one
// passes, so that it leaves this list).
var waitingForTheirOwner = map[string]string{}

// Every YAML snippet of README.md and docs/ passes `delaybridge validate`
// as printed (a fragment: completed as fragmentBase says).
func TestEveryYAMLSnippetValidates(t *testing.T) {
	n := 0
	for _, file := range docFiles(t) {
		for _, b := range blocks(file, read(t, file)) {
			if b.info != "yaml" && b.info != "yml" {
				continue
			}
			first, _, _ := strings.Cut(strings.TrimSpace(b.text), "\n")
			if strings.HasPrefix(first, notConfig) {
				continue
			}
			n++
			text := b.text
			if strings.HasPrefix(first, fragmentMark) {
				text = complete(t, b)
			}
			for _, m := range regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`).FindAllStringSubmatch(text, -1) {
				t.Setenv(m[1], testValue)
			}
			path := filepath.Join(t.TempDir(), "snippet.yaml")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			code := cli.Main([]string{"validate", path}, strings.NewReader(""), &out, &errOut)
			why, waiting := waitingForTheirOwner[file]
			switch {
			case code != 0 && waiting:
				t.Logf("%s:%d does not validate yet (%s):\n%s", file, b.line, why, errOut.String())
			case code != 0:
				t.Errorf("%s:%d: the YAML snippet does not pass validate (a fragment says so on its first line, %q):\n%s\n%s",
					file, b.line, fragmentMark+": ...", errOut.String(), text)
			case waiting:
				t.Errorf("%s:%d validates now: take %s out of waitingForTheirOwner", file, b.line, file)
			}
		}
	}
	if n < 5 {
		t.Errorf("found only %d YAML snippets in README.md and docs/", n)
	}
}

// complete adds to a fragment the keys of fragmentBase it lacks.
func complete(t *testing.T, b block) string {
	t.Helper()
	var frag map[string]yaml.Node
	if err := yaml.Unmarshal([]byte(b.text), &frag); err != nil {
		t.Fatalf("%s:%d: the fragment is not a YAML mapping: %v", b.file, b.line, err)
	}
	text := b.text
	for _, k := range []string{"redis", "sinks"} {
		if _, ok := frag[k]; !ok {
			for _, l := range strings.Split(fragmentBase, "\n") {
				if strings.HasPrefix(l, k+":") {
					text += "\n" + l
				}
			}
		}
	}
	return text + "\n"
}

// A page or a Go comment that cites a section of docs/performance.md by its
// title, in parentheses with the page's name (`(docs/performance.md, "The
// garbage collector")`, `("Scale-out" in docs/performance.md)`), names a
// heading the page has, at its start ("..." in the title stands for any
// text): the page is rewritten by hand and by make bench, and a renamed
// section must not leave the citations pointing at nothing.
func TestPerformanceMdHasTheSectionsCited(t *testing.T) {
	var headings []string
	inFence := false
	for _, l := range strings.Split(read(t, "docs/performance.md"), "\n") {
		if strings.HasPrefix(l, "```") {
			inFence = !inFence
		}
		if !inFence && strings.HasPrefix(l, "#") {
			headings = append(headings, strings.TrimSpace(strings.TrimLeft(l, "#")))
		}
	}
	link := regexp.MustCompile(`\[([^\]]*)\]\([^)\s]*\)`)
	paren := regexp.MustCompile(`\(([^()]*performance\.md[^()]*)\)`)
	quoted := regexp.MustCompile(`"([^"]+)"`)
	cited := 0
	check := func(where, text string) {
		text = link.ReplaceAllString(text, "$1")
		for _, p := range paren.FindAllStringSubmatch(text, -1) {
			for _, q := range quoted.FindAllStringSubmatch(p[1], -1) {
				cited++
				title := regexp.MustCompile(`^` + strings.ReplaceAll(regexp.QuoteMeta(q[1]), `\.\.\.`, `.*`))
				if !slices.ContainsFunc(headings, title.MatchString) {
					t.Errorf("%s cites %q of docs/performance.md, which has no such heading", where, q[1])
				}
			}
		}
	}
	err := filepath.WalkDir(root(t), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root(t) && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root(t), path)
		if rel == filepath.Join("docs", "performance.md") {
			return nil
		}
		switch filepath.Ext(path) {
		case ".md":
			// A paragraph at a time, its lines joined.
			for _, para := range strings.Split(read(t, rel), "\n\n") {
				check(rel, strings.Join(strings.Fields(para), " "))
			}
		case ".go":
			// A comment at a time: consecutive // lines joined.
			var comment []string
			for _, l := range append(strings.Split(read(t, rel), "\n"), "") {
				if c, ok := strings.CutPrefix(strings.TrimSpace(l), "//"); ok {
					comment = append(comment, strings.TrimSpace(c))
					continue
				}
				if len(comment) > 0 {
					check(rel, strings.Join(comment, " "))
					comment = nil
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cited < 5 {
		t.Errorf("found only %d citations of docs/performance.md's sections", cited)
	}
}
