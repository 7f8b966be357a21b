// Package docs tests that the documentation is true, every example being a
// test:
//
//   - readme_test.go runs every `console` block of README.md, verbatim and
//     in order, against a `delaybridge dev` it starts, and compares the
//     output with the lines below each command;
//   - snippets_test.go passes every YAML snippet of README.md and docs/*.md
//     to `delaybridge validate`;
//   - this file checks the statements about `make deps` and the links.
//
// They run in `make test` (go test ./...); the README test needs the binary
// and is skipped by -short.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// root is the repository's root directory.
func root(t *testing.T) string { return testenv.ModuleRoot(t) }

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docFiles are README.md and every docs/*.md, relative to the root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, f := range files {
		out = append(out, filepath.ToSlash(strings.TrimPrefix(f, root(t)+string(filepath.Separator))))
	}
	sort.Strings(out[1:])
	return out
}

// block is a fenced code block of a Markdown file.
type block struct {
	file string
	line int    // of the opening fence, 1-based
	info string // the fence's info string: "yaml", "console", ...
	text string
}

var fence = regexp.MustCompile("^```([A-Za-z0-9_-]*)\\s*$")

// blocks returns the fenced code blocks of a Markdown text.
func blocks(file, text string) []block {
	var out []block
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		b := block{file: file, line: i + 1, info: m[1]}
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, lines[i])
		}
		b.text = strings.Join(body, "\n")
		out = append(out, b)
	}
	return out
}

// What `make deps` installs is said in three places: the script that does
// it, `make help` and the README. They name the same packages.
func TestWhatMakeDepsInstalls(t *testing.T) {
	script := read(t, "scripts/test-deps.sh")
	var pkgs []string
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`missing\+=\(([a-z0-9.+-]+)\)`).FindAllStringSubmatch(script, -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			pkgs = append(pkgs, m[1])
		}
	}
	if len(pkgs) < 2 {
		t.Fatalf("found %d packages in scripts/test-deps.sh: %v", len(pkgs), pkgs)
	}
	if strings.Contains(script, "go install") && strings.Contains(script, "helm") {
		pkgs = append(pkgs, "helm") // built with go install, not apt-get
	}
	help := regexp.MustCompile(`(?m)^deps:.*## (.*)$`).FindStringSubmatch(read(t, "Makefile"))
	if help == nil {
		t.Fatal("the Makefile has no help string for deps")
	}
	readme := read(t, "README.md")
	statement := regexp.MustCompile("`make deps` installs[^.]*\\.").FindString(readme)
	if statement == "" {
		t.Fatal("README.md does not say what `make deps` installs")
	}
	for _, p := range pkgs {
		word := regexp.MustCompile(`(^|[\s(,])` + regexp.QuoteMeta(p) + `([\s),.;]|$)`)
		if !word.MatchString(help[1]) {
			t.Errorf("make help (deps) does not name %s, which scripts/test-deps.sh installs: %q", p, help[1])
		}
		if !word.MatchString(statement) {
			t.Errorf("README.md's statement about make deps does not name %s, which scripts/test-deps.sh installs: %q", p, statement)
		}
	}
}

// Every relative link of README.md and docs/ leads to a file of the
// repository and, with a #fragment, to a heading or an anchor of it.
func TestLinksLeadSomewhere(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchorsOf := map[string]map[string]bool{}
	anchors := func(rel string) map[string]bool {
		if a, ok := anchorsOf[rel]; ok {
			return a
		}
		a := map[string]bool{}
		inFence := false
		for _, l := range strings.Split(read(t, rel), "\n") {
			if strings.HasPrefix(l, "```") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			if h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " "); ok && strings.HasPrefix(l, "#") {
				a[slug(h)] = true
			}
			for _, m := range regexp.MustCompile(`<a id="([^"]+)"`).FindAllStringSubmatch(l, -1) {
				a[m[1]] = true
			}
		}
		anchorsOf[rel] = a
		return a
	}
	for _, file := range docFiles(t) {
		text := read(t, file)
		// Links inside code blocks are code, not links.
		for _, b := range blocks(file, text) {
			text = strings.Replace(text, b.text, "", 1)
		}
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			rel := file
			if path != "" {
				rel = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(file), path)))
				if _, err := os.Stat(filepath.Join(root(t), rel)); err != nil {
					t.Errorf("%s: the link %s leads to no file (%s)", file, target, rel)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(rel, ".md") && !anchors(rel)[frag] {
				t.Errorf("%s: the link %s names no heading or anchor of %s", file, target, rel)
			}
		}
	}
}

// slug is GitHub's anchor of a heading: lower case, spaces to hyphens,
// punctuation but hyphens and underscores dropped.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Nothing in the documentation points outside the repository for the
// contract: docs/reference.md is its place.
func TestNoPointerOutsideTheRepository(t *testing.T) {
	for _, file := range docFiles(t) {
		if strings.Contains(read(t, file), "shared/CONTRACT.md") {
			t.Errorf("%s points to shared/CONTRACT.md, which is not in the repository; point to docs/reference.md", file)
		}
	}
}

// make help's time for the short suite says both what a run takes once
// built and what a first run takes, which compiles everything (a newcomer
// who believed "about a minute" waited four).
func TestMakeHelpShortSaysTheFirstRun(t *testing.T) {
	help := regexp.MustCompile(`(?m)^short:.*## (.*)$`).FindStringSubmatch(read(t, "Makefile"))
	if help == nil {
		t.Fatal("the Makefile has no help string for short")
	}
	if !strings.Contains(help[1], "first run") || !strings.Contains(help[1], "once built") {
		t.Errorf("make help (short) gives one duration for both a first run and a built one: %q", help[1])
	}
}
