package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Problem is one thing wrong with a configuration, at a field path such as
// "ingest[0].kafka.brokers".
type Problem struct {
	Path string
	Msg  string

	line, col int  // where in the file, for the order of the list (0: not in the file)
	unread    bool // the value at Path could not be read and is taken as absent
	// shown is Path as String shows it, followed by the names of the list
	// entries on it that have one: "ingest[1].route.sink (orders-in)" (see
	// named).
	shown string
}

func (p Problem) String() string {
	switch {
	case p.Path == "":
		return p.Msg
	case p.shown != "":
		return p.shown + ": " + p.Msg
	}
	return p.Path + ": " + p.Msg
}

// named sets each problem's shown path: the plain path, then the name
// nameOf knows of each list entry on it ("" when none), in parentheses,
// so that "ingest[1].route.sink" reads "ingest[1].route.sink
// (orders-in)": the field path stays whole for whoever looks for it.
func (ps Problems) named(nameOf func(entry string) string) Problems {
	for i := range ps {
		path := ps[i].Path
		var names []string
		for end := 0; ; {
			j := strings.IndexByte(path[end:], ']')
			if j < 0 {
				break
			}
			end += j + 1
			if name := nameOf(path[:end]); name != "" {
				names = append(names, name)
			}
		}
		if len(names) > 0 {
			ps[i].shown = path + " (" + strings.Join(names, ", ") + ")"
		}
	}
	return ps
}

// entryNames is named's nameOf on a file: the value of the name key of the
// list entry at that path, when it is a mapping with one.
func entryNames(pos map[string]*yaml.Node) func(string) string {
	return func(entry string) string {
		n, ok := pos[entry]
		if !ok || n.Kind != yaml.MappingNode {
			return ""
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k, v := n.Content[i], n.Content[i+1]; k.Value == "name" && v.Kind == yaml.ScalarNode && v.Tag != "!!null" {
				return v.Value
			}
		}
		return ""
	}
}

// Problems is every problem found; it is the error Load returns for an
// invalid file, in the order of the file.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Add adds a problem at path, its message formatted like fmt.Sprintf.
func (ps *Problems) Add(path, format string, args ...any) {
	*ps = append(*ps, Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// addAt adds a problem found at node n of the file.
func (ps *Problems) addAt(n *yaml.Node, path, format string, args ...any) {
	*ps = append(*ps, Problem{Path: path, Msg: fmt.Sprintf(format, args...), line: n.Line, col: n.Column})
}

// unreadable adds a problem with the value at node n and makes the node a
// null, so that decoding reads everything else and takes this value as
// absent.
func (ps *Problems) unreadable(n *yaml.Node, path, format string, args ...any) {
	*ps = append(*ps, Problem{Path: path, Msg: fmt.Sprintf(format, args...), line: n.Line, col: n.Column, unread: true})
	*n = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
}

// Load reads, expands, checks, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, os.LookupEnv)
}

// Parse is Load on bytes, with lookup for ${VAR} expansion. On invalid input
// the error is Problems, listing every problem found, in the order of the
// file.
//
// It works in two passes. The first reads the file's shape: unknown keys,
// values of the wrong type, unset variables. A value it reports is then
// treated as absent, so that the second pass, the checks of meaning
// (Validate), runs on a configuration read completely, and does not report
// what follows from the absence: nothing at or below a path already
// reported, no cross-field check that involves such a value. If the file
// still cannot be decoded, only the first pass's problems are reported: the
// checks never run on a half-read file.
func Parse(data []byte, lookup func(string) (string, bool)) (*Config, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, Problems{{Msg: "the file is empty"}}
		}
		return nil, Problems{{Msg: "not valid YAML: " + err.Error()}}
	}
	var probs Problems
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	pos := map[string]*yaml.Node{}
	indexNodes(root, "", pos)
	expandNode(root, "", lookup, &probs)
	checkKeys(root, reflect.TypeOf(Config{}), "", &probs)
	structural := slices.Clone(probs)

	var cfg Config
	if err := root.Decode(&cfg); err != nil {
		// checkKeys missed a value the decoder refuses: report it, and
		// nothing that a check of the half-read rest would say.
		var te *yaml.TypeError
		if errors.As(err, &te) {
			for _, e := range te.Errors {
				probs.Add("", "%s", e)
			}
		} else {
			probs.Add("", "%s", err)
		}
		return nil, inFileOrder(probs, pos).named(entryNames(pos))
	}
	cfg.unread = map[string]bool{}
	for _, p := range structural {
		if p.unread && p.Path != "" {
			cfg.unread[p.Path] = true
		}
	}
	loadSecretFiles(reflect.ValueOf(&cfg), "", &probs)
	cfg.ApplyDefaults()
	var semantic Problems
	if err := cfg.Validate(); err != nil {
		errors.As(err, &semantic)
	}
	for _, sp := range semantic {
		if !underAny(sp.Path, structural) {
			probs = append(probs, sp)
		}
	}
	cfg.unread = nil
	if len(probs) > 0 {
		return nil, inFileOrder(probs, pos).named(entryNames(pos))
	}
	return &cfg, nil
}

// indexNodes records the node of every key and list entry by its path, so
// that a problem found after decoding can be placed in the file.
func indexNodes(n *yaml.Node, path string, pos map[string]*yaml.Node) {
	switch n.Kind {
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			pos[p] = c
			indexNodes(c, p, pos)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := join(path, n.Content[i].Value)
			if _, seen := pos[p]; !seen {
				pos[p] = n.Content[i]
			}
			indexNodes(n.Content[i+1], p, pos)
		}
	}
}

// inFileOrder sorts problems by where they are in the file: a problem
// without a place of its own (a missing key) goes where its nearest parent
// is, and one about something not in the file at all goes last. Problems at
// one place keep the order they were found in.
func inFileOrder(ps Problems, pos map[string]*yaml.Node) Problems {
	for i := range ps {
		if ps[i].line != 0 {
			continue
		}
		for p := ps[i].Path; p != ""; p = parentPath(p) {
			if n, ok := pos[p]; ok {
				ps[i].line, ps[i].col = n.Line, n.Column
				break
			}
		}
	}
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		switch {
		case a.line == 0 || b.line == 0:
			return b.line == 0 && a.line != 0
		case a.line != b.line:
			return a.line < b.line
		}
		return a.col < b.col
	})
	return ps
}

// parentPath strips the last key or index of a path: "a.b[2]" -> "a.b",
// "a.b" -> "a", "a" -> "".
func parentPath(p string) string {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// underAny reports whether path is at or below the path of one of ps: a
// value already reported as malformed is not reported again as missing.
func underAny(path string, ps Problems) bool {
	for _, p := range ps {
		if p.Path == "" {
			continue
		}
		if path == p.Path || strings.HasPrefix(path, p.Path+".") || strings.HasPrefix(path, p.Path+"[") {
			return true
		}
	}
	return false
}

// isUnread reports whether the value at path could not be read (it was
// reported as malformed, and is taken as absent): a check that compares it
// with another value is skipped rather than report what follows from its
// absence. Always false outside Parse.
func (c *Config) isUnread(path string) bool {
	if c.unread[path] {
		return true
	}
	for p := range c.unread {
		if strings.HasPrefix(path, p+".") || strings.HasPrefix(path, p+"[") {
			return true
		}
	}
	return false
}

// unreadEntries reports whether the list at path (e.g. "sinks") was not
// read completely: the list itself, one of its entries, or the field of an
// entry named field was malformed. A check that looks a name up in the list
// is skipped then.
func (c *Config) unreadEntries(path, field string) bool {
	for p := range c.unread {
		if p == path {
			return true
		}
		rest, ok := strings.CutPrefix(p, path+"[")
		if !ok {
			continue
		}
		_, after, ok := strings.Cut(rest, "]")
		if ok && (after == "" || after == "."+field || strings.HasPrefix(after, "."+field+".")) {
			return true
		}
	}
	return false
}

// envRef matches ${VAR} and ${VAR:-default}; $${...} is an escaped literal.
var envRef = regexp.MustCompile(`\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)

// expandNode replaces ${VAR} in every scalar value (not in keys), after
// parsing, so that a value from the environment can never change the YAML
// structure. A plain scalar that was expanded is re-typed, so ${PORT} may
// stand for a number.
func expandNode(n *yaml.Node, path string, lookup func(string) (string, bool), probs *Problems) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			p := path
			if n.Kind == yaml.SequenceNode {
				p = fmt.Sprintf("%s[%d]", path, i)
			}
			expandNode(c, p, lookup, probs)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			expandNode(n.Content[i+1], join(path, n.Content[i].Value), lookup, probs)
		}
	case yaml.ScalarNode:
		if !strings.Contains(n.Value, "${") {
			return
		}
		out := envRef.ReplaceAllStringFunc(n.Value, func(m string) string {
			if m == "$${" {
				return "${"
			}
			sub := envRef.FindStringSubmatch(m)
			if v, ok := lookup(sub[1]); ok {
				return v
			}
			if sub[2] != "" {
				return sub[3]
			}
			*probs = append(*probs, Problem{Path: path, line: n.Line, col: n.Column, unread: true,
				Msg: fmt.Sprintf("environment variable %s is not set (export it, or write ${%s:-default} for a default)", sub[1], sub[1])})
			return ""
		})
		if out != n.Value {
			n.Value = out
			if n.Style == 0 { // plain: let YAML resolve the type of the expanded value
				n.Tag = ""
			}
		}
	}
}

var durationType = reflect.TypeOf(Duration(0))

// checkKeys reports every mapping key with no field of that yaml name in t,
// with its path, and values of the wrong shape for Duration fields.
func checkKeys(n *yaml.Node, t reflect.Type, path string, probs *Problems) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch {
	case t == durationType:
		if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
			if _, err := time.ParseDuration(n.Value); err != nil {
				probs.unreadable(n, path, "%q is not a duration; write it with a unit, e.g. 30s, 500ms, 5m", n.Value)
			}
		} else if n.Kind != yaml.ScalarNode {
			probs.unreadable(n, path, "expected a duration (e.g. 30s, 500ms, 5m), got %s", describe(n))
		}
	case scalarKind(t) != "":
		if n.Kind != yaml.ScalarNode {
			probs.unreadable(n, path, "expected %s, got %s", scalarKind(t), describe(n))
		} else if n.Tag != "!!null" {
			checkScalar(n, t, path, probs)
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if n.Tag != "!!null" {
				probs.unreadable(n, path, "expected a mapping of keys, got %s", describe(n))
			}
			return
		}
		fields := map[string]reflect.Type{}
		addFields(t, fields)
		brokerFields(t, fields)
		seen := map[string]int{} // key -> the line it is first given on
		kept := n.Content[:0:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			p := join(path, k)
			ft, ok := fields[k]
			if !ok {
				known := sortedKeys(fields)
				if guess := closest(k, known); guess != "" {
					probs.addAt(n.Content[i], p, "unknown key; did you mean %s? (known keys here: %s)", guess, strings.Join(known, ", "))
				} else {
					probs.addAt(n.Content[i], p, "unknown key (known keys here: %s)", strings.Join(known, ", "))
				}
				continue
			}
			if first, ok := seen[k]; ok {
				// The first one is read on; the decoder would refuse the file.
				probs.addAt(n.Content[i], p, "key given twice, on lines %d and %d; give it once (merge what the two hold)", first, n.Content[i].Line)
				continue
			}
			seen[k] = n.Content[i].Line
			checkKeys(n.Content[i+1], ft, p, probs)
			kept = append(kept, n.Content[i], n.Content[i+1])
		}
		n.Content = kept
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		if n.Kind != yaml.SequenceNode {
			if n.Tag != "!!null" {
				probs.unreadable(n, path, "expected a list, got %s", describe(n))
			}
			return
		}
		for i, c := range n.Content {
			checkKeys(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), probs)
		}
	}
}

// addFields collects the yaml names of t's fields, those of ,inline
// structs included.
func addFields(t reflect.Type, fields map[string]reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case opts == "inline" && f.Type.Kind() == reflect.Struct:
			addFields(f.Type, fields)
		case name != "" && name != "-":
			fields[name] = f.Type
		}
	}
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

func sortedKeys(m map[string]reflect.Type) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// closest returns the known key a misspelt key most likely meant: the
// nearest by edit distance (a swap of two neighbours counts as one edit),
// at most 2 edits and at most a third of the key's length, the first in
// order on a tie; "" when none is that near.
func closest(key string, known []string) string {
	best, bestD := "", 0
	for _, k := range known {
		d := editDistance(strings.ToLower(key), k)
		if d <= 2 && 3*d <= len(key) && (best == "" || d < bestD) {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent bytes.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// UnmarshalYAML reads a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (e.g. 30s, 500ms, 5m)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// scalarKind names the YAML scalar a field of type t takes, "" for others.
func scalarKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	}
	return ""
}

// checkScalar reports a scalar that does not fit a field of type t.
func checkScalar(n *yaml.Node, t reflect.Type, path string, probs *Problems) {
	var err error
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		var v int64
		err = n.Decode(&v)
	case reflect.Float64:
		var v float64
		err = n.Decode(&v)
	case reflect.Bool:
		var v bool
		err = n.Decode(&v)
	}
	if err != nil {
		probs.unreadable(n, path, "%q is not %s", n.Value, scalarKind(t))
	}
}
