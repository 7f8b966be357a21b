package cli

// docs/reference.md is written from the code: its sections between
// "<!-- generated:NAME -->" and "<!-- end:NAME -->" are made here from the
// command tree (cli), the configuration's types, defaults and comments
// (config) and pkg/admin/openapi.json (api), and every header name of
// pkg/envelope must be in it. When the code changes, this test fails until
//
//	go test ./cmd/delaybridge/cli -run TestReferenceIsTheCode -update
//
// rewrites the generated sections (the hand-written text around them stays).

import (
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
)

var update = flag.Bool("update", false, "rewrite the generated sections of docs/reference.md")

// repoRoot is the module's root directory.
func repoRoot(t *testing.T) string { return testenv.ModuleRoot(t) }

func TestReferenceIsTheCode(t *testing.T) {
	root := repoRoot(t)
	path := filepath.Join(root, "docs", "reference.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	sections := map[string]string{
		"cli":    referenceCLI(),
		"config": referenceConfig(t, root),
		"api":    referenceAPI(t, root),
	}
	names := make([]string, 0, len(sections))
	for name := range sections {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		begin, end := "<!-- generated:"+name+" -->\n", "<!-- end:"+name+" -->"
		i, j := strings.Index(doc, begin), strings.Index(doc, end)
		if i < 0 || j < i {
			t.Fatalf("docs/reference.md has no %q ... %q section", strings.TrimSpace(begin), end)
		}
		want := doc[:i+len(begin)] + sections[name] + doc[j:]
		if want != doc && !*update {
			t.Errorf("docs/reference.md, section %q, is not what the code says; run\n"+
				"  go test ./cmd/delaybridge/cli -run TestReferenceIsTheCode -update\nand review the diff", name)
		}
		doc = want
	}
	if *update && doc != string(data) {
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range headerNames(t, root) {
		if !strings.Contains(doc, "`"+h+"`") {
			t.Errorf("docs/reference.md does not name the header %s (pkg/envelope)", h)
		}
	}
}

// headerNames are the values of pkg/envelope's Header* constants.
func headerNames(t *testing.T, root string) []string {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, filepath.Join(root, "pkg", "envelope"), func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if !strings.HasPrefix(n.Name, "Header") || !n.IsExported() || i >= len(vs.Values) {
							continue
						}
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							v, _ := strconv.Unquote(lit.Value)
							out = append(out, v)
						}
					}
				}
			}
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d header constants in pkg/envelope: %v", len(out), out)
	}
	return out
}

// ---- the command line ----

func referenceCLI() string {
	a := &app{}
	root := a.rootCmd()
	var b strings.Builder
	b.WriteString("Global flag of every command: `-c`, `--config FILE` (default `$DELAYBRIDGE_CONFIG`).\n")
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || (c.Name() == "completion" && c != root) {
				continue
			}
			fmt.Fprintf(&b, "\n#### `%s`\n\n%s.", sub.CommandPath(), strings.TrimSuffix(sub.Short, "."))
			if sub.Runnable() && sub.Annotations[needsSubcommand] == "" {
				fmt.Fprintf(&b, " Usage: `%s`.", strings.TrimSpace(sub.Parent().CommandPath()+" "+sub.Use))
			}
			b.WriteString("\n")
			var rows []string
			sub.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
				if f.Hidden || f.Name == "help" || f.Name == "config" {
					return
				}
				def := f.DefValue
				switch {
				case f.Value.Type() == "bool" && def == "false", def == "" || def == "[]":
					def = ""
				default:
					def = "`" + def + "`"
				}
				name := "`--" + f.Name
				if f.Shorthand != "" {
					name = "`-" + f.Shorthand + "`, " + name
				}
				if f.Value.Type() != "bool" {
					name += " " + f.Value.Type()
				}
				name += "`"
				rows = append(rows, fmt.Sprintf("| %s | %s | %s |", name, def, mdCell(f.Usage)))
			})
			if len(rows) > 0 {
				b.WriteString("\n| flag | default | meaning |\n|---|---|---|\n")
				b.WriteString(strings.Join(rows, "\n") + "\n")
			}
			if sub.Name() != "completion" {
				walk(sub)
			}
		}
	}
	walk(root)
	return b.String()
}

func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// ---- the configuration ----

// referenceConfig lists every key: path, type, default (as ApplyDefaults
// sets it on an otherwise empty file), and the field's comment in the Go
// source, else the key's comment in config.example.yaml.
func referenceConfig(t *testing.T, root string) string {
	comments := fieldComments(t, root)
	example := exampleComments(t, filepath.Join(root, "config.example.yaml"))
	// One ingest and one sink of each broker kind, named NAME (a NATS
	// ingest with a stream: its JetStream defaults), read twice: as
	// written and with the defaults applied. A default is what differs.
	var y strings.Builder
	y.WriteString("ingest:\n")
	for _, k := range config.BrokerKinds() {
		block := "{}"
		if k == "nats" {
			block = "{stream: STREAM}"
		}
		fmt.Fprintf(&y, "  - {name: NAME, %s: %s}\n", k, block)
	}
	y.WriteString("sinks:\n")
	for _, k := range config.BrokerKinds() {
		fmt.Fprintf(&y, "  - {name: NAME, %s: {}}\n", k)
	}
	var cfg, raw config.Config
	for _, c := range []*config.Config{&cfg, &raw} {
		if err := yaml.Unmarshal([]byte(y.String()), c); err != nil {
			t.Fatal(err)
		}
	}
	cfg.ApplyDefaults()
	rawAt := map[string]string{}
	collectLeaves(reflect.ValueOf(&raw), "", rawAt)

	var b strings.Builder
	b.WriteString("| key | type | default | meaning |\n|---|---|---|---|\n")
	var walk func(v reflect.Value, path string)
	row := func(path string, owner reflect.Type, f reflect.StructField, v reflect.Value) {
		desc := goComment(comments[owner.String()+"|"+f.Name], f.Name)
		if desc == "" || f.Name == "Broker" {
			if td := goComment(comments[typeOf(f.Type).String()+"|"], typeOf(f.Type).Name()); td != "" {
				desc = td
			}
		}
		if desc == "" && regexp.MustCompile(`\.(kafka|nats|rabbitmq)\.`).MatchString(path) {
			desc = example[path] // the broker packages' fields: config.example.yaml's comment
			if desc == "" && (owner.Name() == "Auth" || owner.Name() == "SASL") {
				desc = goComment(comments[owner.String()+"|"], owner.Name())
			}
			if first, _, _ := strings.Cut(desc, " "); desc != "" && !strings.ContainsAny(first, ":/_.") {
				desc = strings.ToUpper(desc[:1]) + desc[1:]
			}
		}
		def := defaultOf(v)
		if def == rawAt[path] {
			def = "" // as written: not a default
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", path, typeName(f.Type), def, mdCell(desc))
	}
	walk = func(v reflect.Value, path string) {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v = reflect.New(v.Type().Elem())
			}
			v = v.Elem()
		}
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() {
				continue
			}
			fv := v.Field(i)
			switch {
			case opts == "inline":
				walk(fv, path)
				continue
			case name == "-" && f.Type.Kind() == reflect.Interface:
				continue // broker blocks: listed under their kind below
			case name == "" || name == "-":
				continue
			}
			p := joinPath(path, name)
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft.Kind() == reflect.Struct && ft != reflect.TypeOf(config.Duration(0)):
				row(p, t, f, fv)
				walk(fv, p)
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
				row(p, t, f, fv)
				if t == reflect.TypeOf(config.Config{}) && (name == "ingest" || name == "sinks") {
					walkEntries(fv, p+"[]", walk, row)
					continue
				}
				elem := reflect.New(ft.Elem()).Elem()
				if fv.Len() > 0 {
					elem = fv.Index(0)
				}
				walk(elem, p+"[]")
			default:
				row(p, t, f, fv)
			}
		}
	}
	walk(reflect.ValueOf(&cfg), "")
	return b.String()
}

// collectLeaves records defaultOf of every field by its path (lists as
// "[]", their first entry; broker blocks by their kind).
func collectLeaves(v reflect.Value, path string, out map[string]string) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || v.Type() == reflect.TypeOf(config.Duration(0)) {
		return
	}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		fv := v.Field(i)
		switch {
		case opts == "inline":
			collectLeaves(fv, path, out)
		case name == "-" && f.Type.Kind() == reflect.Interface && !fv.IsNil():
			kind := fv.MethodByName("Kind").Call(nil)[0].String()
			collectLeaves(fv, path+"."+kind, out)
		case name == "" || name == "-":
		case fv.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			for j := 0; j < fv.Len(); j++ {
				collectLeaves(fv.Index(j), joinPath(path, name)+"[]", out)
			}
		default:
			p := joinPath(path, name)
			out[p] = defaultOf(fv)
			collectLeaves(fv, p, out)
		}
	}
}

// goComment makes a Go doc comment read as a description: "Lease is how
// long..." becomes "How long...", "MaxSleep bounds..." "Bounds...".
func goComment(text, name string) string {
	if rest, ok := strings.CutPrefix(text, name+" "); ok && name != "" {
		verb, after, _ := strings.Cut(rest, " ")
		switch {
		case verb == "is" || verb == "are":
			text = after
		case strings.HasSuffix(verb, "s") && verb != "and" && !strings.HasSuffix(verb, "ss"):
			text = rest
		}
	}
	if text != "" {
		text = strings.ToUpper(text[:1]) + text[1:]
	}
	return text
}

func typeOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	return t
}

// walkEntries lists an ingest or sink entry's own keys once and then each
// broker kind's block.
func walkEntries(list reflect.Value, path string, walk func(reflect.Value, string), row func(string, reflect.Type, reflect.StructField, reflect.Value)) {
	if list.Len() == 0 {
		return
	}
	walk(list.Index(0), path)
	seen := map[string]bool{}
	for i := 0; i < list.Len(); i++ {
		b := list.Index(i).FieldByName("Broker")
		if b.IsNil() {
			continue
		}
		kind := b.MethodByName("Kind").Call(nil)[0].String()
		if seen[kind] {
			continue
		}
		seen[kind] = true
		block := b.Elem()
		row(path+"."+kind, list.Index(i).Type(), reflect.StructField{Name: "Broker", Type: block.Type()}, block)
		walk(block, path+"."+kind)
	}
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// typeName is how a field's YAML value is written.
func typeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeOf(config.Duration(0)):
		return "duration"
	case t == reflect.TypeOf(config.Secret("")):
		return "secret"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "integer"
	case reflect.Float64:
		return "number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Struct {
			return "list of mappings"
		}
		return "list of " + typeName(t.Elem()) + "s"
	case reflect.Struct:
		return "mapping"
	}
	return t.String()
}

// defaultOf is the value ApplyDefaults left, written as in YAML; empty for
// a zero value or a mapping.
func defaultOf(v reflect.Value) string {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	switch {
	case v.Type() == reflect.TypeOf(config.Duration(0)):
		if v.Int() == 0 {
			return ""
		}
		d := config.Duration(v.Int()).String() // "5m0s": written "5m"
		if strings.HasSuffix(d, "m0s") || strings.HasSuffix(d, "h0m0s") {
			d = strings.TrimSuffix(d, "0s")
		}
		if strings.HasSuffix(d, "h0m") {
			d = strings.TrimSuffix(d, "0m")
		}
		return "`" + d + "`"
	case v.Kind() == reflect.Struct:
		return ""
	case v.Kind() == reflect.Slice:
		if v.Len() == 0 || v.Type().Elem().Kind() == reflect.Struct {
			return ""
		}
		b, _ := json.Marshal(v.Interface())
		return "`" + strings.ReplaceAll(string(b), `"`, "") + "`"
	case v.IsZero() && v.Kind() != reflect.Bool:
		return ""
	}
	return "`" + fmt.Sprint(v.Interface()) + "`"
}

// fieldComments maps "<Go type>|<field>" to the field's comment in the
// sources of pkg/config and the broker packages.
func fieldComments(t *testing.T, root string) map[string]string {
	out := map[string]string{}
	dirs := map[string]string{
		"config":       "pkg/config",
		"kafkabroker":  "pkg/brokers/kafkabroker",
		"natsbroker":   "pkg/brokers/natsbroker",
		"rabbitbroker": "pkg/brokers/rabbitbroker",
	}
	for pkg, dir := range dirs {
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, filepath.Join(root, dir), func(fi os.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkgs {
			// A type's doc comment sits on its declaration (type X struct).
			typeDocs := map[*ast.TypeSpec]string{}
			ast.Inspect(p, func(n ast.Node) bool {
				if g, ok := n.(*ast.GenDecl); ok && g.Tok == token.TYPE {
					for _, spec := range g.Specs {
						ts := spec.(*ast.TypeSpec)
						doc := ts.Doc.Text()
						if doc == "" && len(g.Specs) == 1 {
							doc = g.Doc.Text()
						}
						typeDocs[ts] = strings.Join(strings.Fields(doc), " ")
					}
				}
				return true
			})
			ast.Inspect(p, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return true
				}
				if doc := typeDocs[ts]; doc != "" {
					out[pkg+"."+ts.Name.Name+"|"] = doc
				}
				for _, f := range st.Fields.List {
					text := f.Doc.Text()
					if text == "" {
						text = f.Comment.Text()
					}
					text = strings.Join(strings.Fields(text), " ")
					for _, n := range f.Names {
						out[pkg+"."+ts.Name.Name+"|"+n.Name] = text
					}
				}
				return true
			})
		}
	}
	return out
}

// exampleComments maps key paths (lists as "[]") to the comment on their
// line in config.example.yaml, with the comment lines below it that
// continue it (a "#" in the same column).
func exampleComments(t *testing.T, path string) map[string]string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	comment := func(k, v *yaml.Node) string {
		c := k.LineComment
		if c == "" {
			c = v.LineComment
		}
		if c == "" || k.Line < 1 || k.Line > len(lines) {
			return ""
		}
		col := strings.Index(lines[k.Line-1], c)
		if col < 0 {
			return strings.TrimSpace(strings.TrimPrefix(c, "#"))
		}
		parts := []string{strings.TrimSpace(strings.TrimPrefix(c, "#"))}
		for _, l := range lines[k.Line:] {
			if strings.TrimSpace(l) == "" || len(l) <= col || l[col] != '#' || strings.TrimSpace(l[:col]) != "" {
				break
			}
			parts = append(parts, strings.TrimSpace(l[col+1:]))
		}
		return strings.Join(parts, " ")
	}
	out := map[string]string{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, path+"[]")
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := joinPath(path, k.Value)
				if c := comment(k, v); c != "" && out[p] == "" {
					out[p] = c
				}
				walk(v, p)
			}
		}
	}
	walk(&doc, "")
	return out
}

// ---- the admin API ----

// apiTags is the order of the api section: by what a route is for (its
// tag), then by path and method. The document itself is no guide: huma
// writes its paths sorted.
var apiTags = []string{"probes", "messages", "dead", "groups", "stats", "sinks", "dashboard", "pprof"}

func referenceAPI(t *testing.T, root string) string {
	data, err := os.ReadFile(filepath.Join(root, "pkg", "admin", "openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	type schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]schema `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	type op struct {
		Summary    string   `json:"summary"`
		Tags       []string `json:"tags"`
		Parameters []struct {
			Name string `json:"name"`
			In   string `json:"in"`
		} `json:"parameters"`
		RequestBody struct {
			Content map[string]struct {
				Schema struct {
					Ref string `json:"$ref"`
				} `json:"schema"`
			} `json:"content"`
		} `json:"requestBody"`
		Responses map[string]json.RawMessage `json:"responses"`
	}
	// takes is what an operation reads besides its path: its query
	// parameters in the document's order, then its JSON body's fields,
	// the required ones first, an optional one marked ?.
	takes := func(o op) string {
		var parts []string
		for _, p := range o.Parameters {
			if p.In == "query" {
				parts = append(parts, "`"+p.Name+"`")
			}
		}
		if ref := o.RequestBody.Content["application/json"].Schema.Ref; ref != "" {
			sc, ok := doc.Components.Schemas[strings.TrimPrefix(ref, "#/components/schemas/")]
			if !ok {
				t.Fatalf("openapi.json: no schema %s", ref)
			}
			var fields []string
			for _, name := range sc.Required {
				fields = append(fields, strconv.Quote(name))
			}
			var optional []string
			for name := range sc.Properties {
				if !slices.Contains(sc.Required, name) {
					optional = append(optional, strconv.Quote(name)+"?")
				}
			}
			sort.Strings(optional)
			parts = append(parts, "`{"+strings.Join(append(fields, optional...), ", ")+"}`")
		}
		return strings.Join(parts, ", ")
	}
	type row struct {
		tag                   int
		path, method          string
		codes, takes, summary string
	}
	var rows []row
	for p, methods := range doc.Paths {
		for m, raw := range methods {
			if m == "parameters" {
				continue
			}
			var o op
			if err := json.Unmarshal(raw, &o); err != nil {
				t.Fatalf("openapi.json %s %s: %v", m, p, err)
			}
			tag := -1
			if len(o.Tags) == 1 {
				tag = slices.Index(apiTags, o.Tags[0])
			}
			if tag < 0 {
				t.Fatalf("openapi.json %s %s: tags %q: give it one of %q (or add its tag to apiTags)", m, p, o.Tags, apiTags)
			}
			codes := make([]string, 0, len(o.Responses))
			for c := range o.Responses {
				codes = append(codes, c)
			}
			sort.Strings(codes)
			rows = append(rows, row{tag, p, m, strings.Join(codes, ", "), takes(o), o.Summary})
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.tag != b.tag {
			return a.tag < b.tag
		}
		if a.path != b.path {
			return a.path < b.path
		}
		return methodOrder(a.method) < methodOrder(b.method)
	})
	var b strings.Builder
	b.WriteString("| request | takes | answers | what |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s %s` | %s | %s | %s |\n", strings.ToUpper(r.method), r.path, r.takes, r.codes, mdCell(r.summary))
	}
	return b.String()
}

func methodOrder(m string) int {
	return strings.Index("get post patch put delete", m)
}
