package docs

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A comment says what the code does and why, in the present: it names no
// issue by number, since a reader of the code has the code and not the
// tracker, and every file or folder of the repository it cites exists, so
// that a file renamed or removed leaves no comment pointing at nothing. The
// test reads the comments of every .go file (go/parser) and of every Lua
// script (its -- and --[[ ]] comments), outside vendor, testdata, bin and
// hidden folders. A word cites a path when it ends in .go, .md, .lua,
// .yaml, .yml, .json or .sh, or starts with docs/, pkg/, cmd/, test/,
// internal/ or deploy/; URLs, import paths, absolute paths and placeholders
// (<name>, {x}, a glob) are not citations. A cited path is found from the
// repository's root, or from the commenting file's folder or one above it
// (a script of pkg/store/lua/lib may name a file of pkg/store by its name);
// a word that is the last element of a Go module of go.mod (nats.go) names
// that module, not a file.
func TestCommentsCiteNoIssueAndOnlyRealPaths(t *testing.T) {
	base := root(t)
	modules := moduleNames(t, base)
	var checked int
	err := filepath.WalkDir(base, func(file string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case file == base:
			case strings.HasPrefix(name, "."), name == "vendor", name == "testdata", name == "bin", name == "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		var comments []comment
		switch filepath.Ext(file) {
		case ".go":
			comments = goComments(t, file)
		case ".lua":
			b, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			comments = luaComments(string(b))
		default:
			return nil
		}
		rel, err := filepath.Rel(base, file)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		for _, c := range comments {
			checked++
			for _, p := range commentProblems(base, filepath.Dir(file), modules, c) {
				t.Errorf("%s:%d: %s", rel, p.line, p.what)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 1000 {
		t.Fatalf("read only %d comments: the walk missed the tree", checked)
	}
}

// comment is the text of one comment (a Go comment group or a Lua
// comment), one entry per line, with the line each starts on.
type comment struct {
	line  int
	lines []string
}

type problem struct {
	line int
	what string
}

// An issue number: "issue" followed by a number, or "issue" or "issues"
// followed by "#" and a number.
var issueNumber = regexp.MustCompile(`(?i)\bissues?\s*#\s*\d+|\bissue\s+\d+`)

// A cited path: a word of path characters.
var pathWord = regexp.MustCompile(`[A-Za-z0-9_.*<>{}/\-]+`)

// Extensions and folders that make a word a citation of a repository file.
var (
	citedExt    = []string{".go", ".md", ".lua", ".yaml", ".yml", ".json", ".sh"}
	citedPrefix = []string{"docs/", "pkg/", "cmd/", "test/", "internal/", "deploy/"}
)

func commentProblems(base, dir string, modules map[string]bool, c comment) []problem {
	var out []problem
	for i, l := range c.lines {
		// The number may sit on the next line of the comment: a match is
		// the line's if it starts there.
		joined := l
		if i+1 < len(c.lines) {
			joined += " " + c.lines[i+1]
		}
		for _, loc := range issueNumber.FindAllStringIndex(joined, -1) {
			if loc[0] < len(l) {
				m := strings.Join(strings.Fields(joined[loc[0]:loc[1]]), " ")
				out = append(out, problem{c.line + i, "names an issue (" + m + "): say what the code does and why instead"})
			}
		}
		for _, w := range cited(l) {
			if !modules[w] && !found(base, dir, w) {
				out = append(out, problem{c.line + i, "cites " + w + ", which is neither under the repository's root nor under this file's folder or one above it"})
			}
		}
	}
	return out
}

// cited returns the words of a comment line that cite a repository path.
func cited(line string) []string {
	var out []string
	for _, loc := range pathWord.FindAllStringIndex(line, -1) {
		w := line[loc[0]:loc[1]]
		// A URL, or a word of one, is not a repository path.
		if loc[0] > 0 && (strings.HasSuffix(line[:loc[0]], ":") || strings.HasSuffix(line[:loc[0]], "@")) {
			continue
		}
		if strings.Contains(line[loc[1]:min(loc[1]+3, len(line))], "://") {
			continue
		}
		w = strings.TrimRight(w, ".-")
		w = strings.TrimPrefix(w, "./")
		if w == "" || strings.ContainsAny(w, "*<>{}") || strings.Contains(w, "...") || strings.HasPrefix(w, "/") {
			continue // a placeholder, a glob or an absolute path outside the repository
		}
		if strings.Contains(w, ".com/") || strings.Contains(w, ".io/") || strings.Contains(w, ".org/") {
			continue // an import path or a host
		}
		isCited := false
		for _, e := range citedExt {
			if strings.HasSuffix(w, e) && len(w) > len(e) {
				isCited = true
			}
		}
		for _, p := range citedPrefix {
			if strings.HasPrefix(w, p) && len(w) > len(p) {
				isCited = true
			}
		}
		if isCited {
			out = append(out, w)
		}
	}
	return out
}

// found reports whether rel is a path from base or from dir or one of its
// parents up to base.
func found(base, dir, rel string) bool {
	for {
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(rel))); err == nil {
			return true
		}
		if dir == base || !strings.HasPrefix(dir, base) {
			break
		}
		dir = filepath.Dir(dir)
	}
	_, err := os.Stat(filepath.Join(base, filepath.FromSlash(rel)))
	return err == nil
}

// moduleNames are the last elements of the module paths go.mod requires
// (nats.go of github.com/nats-io/nats.go).
func moduleNames(t *testing.T, base string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*(?:require\s+)?([a-z0-9.-]+\.[a-z]+/\S+)\s+v\S+`).FindAllStringSubmatch(read(t, "go.mod"), -1) {
		out[path.Base(m[1])] = true
	}
	if !out["nats.go"] {
		t.Fatalf("found no module nats.go in go.mod: %v", out)
	}
	return out
}

// goComments returns the comments of a Go file, the lines of adjacent //
// comments together.
func goComments(t *testing.T, file string) []comment {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var out []comment
	for _, g := range f.Comments {
		for _, c := range g.List {
			text := c.Text
			if rest, ok := strings.CutPrefix(text, "//"); ok {
				text = rest
			} else {
				text = strings.TrimSuffix(strings.TrimPrefix(text, "/*"), "*/")
			}
			lines := strings.Split(text, "\n")
			start := fset.Position(c.Slash).Line
			// The lines of one group read as one text: a number split from
			// its "issue" by a line break is still found.
			if n := len(out); n > 0 && out[n-1].line+len(out[n-1].lines) == start && strings.HasPrefix(c.Text, "//") {
				out[n-1].lines = append(out[n-1].lines, lines...)
				continue
			}
			out = append(out, comment{line: start, lines: lines})
		}
	}
	return out
}

var luaLong = regexp.MustCompile(`^\[(=*)\[`)

// luaComments returns the comments of a Lua script: "--" to the end of the
// line and "--[[ ... ]]" (with any level of "="), skipping strings.
func luaComments(src string) []comment {
	var out []comment
	line := 1
	for i := 0; i < len(src); {
		switch ch := src[i]; {
		case ch == '\n':
			line++
			i++
		case ch == '\'' || ch == '"':
			j := i + 1
			for j < len(src) && src[j] != ch && src[j] != '\n' {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			i = j + 1
		case ch == '[' && luaLong.MatchString(src[i:]): // a long string
			m := luaLong.FindStringSubmatch(src[i:])
			closing := "]" + m[1] + "]"
			body := src[i+len(m[0]):]
			end := strings.Index(body, closing)
			if end < 0 {
				end = len(body)
			}
			line += strings.Count(body[:end], "\n")
			i += len(m[0]) + end + len(closing)
		case strings.HasPrefix(src[i:], "--"):
			rest := src[i+2:]
			if m := luaLong.FindStringSubmatch(rest); m != nil {
				closing := "]" + m[1] + "]"
				body := rest[len(m[0]):]
				end := strings.Index(body, closing)
				if end < 0 {
					end = len(body)
				}
				text := body[:end]
				out = append(out, comment{line: line, lines: strings.Split(text, "\n")})
				line += strings.Count(text, "\n")
				i += 2 + len(m[0]) + end + len(closing)
				continue
			}
			end := strings.IndexByte(rest, '\n')
			if end < 0 {
				end = len(rest)
			}
			text := rest[:end]
			if n := len(out); n > 0 && out[n-1].line+len(out[n-1].lines) == line {
				out[n-1].lines = append(out[n-1].lines, text)
			} else {
				out = append(out, comment{line: line, lines: []string{text}})
			}
			i += 2 + end
		default:
			i++
		}
	}
	return out
}
