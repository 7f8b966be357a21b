package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/pkg/config"
)

// exampleIsExample are the keys of config.example.yaml whose values are
// examples by nature (names, addresses, topics, routes) or required: the
// file's header says so. Lists of entries as "[]".
var exampleIsExample = regexp.MustCompile(`^(redis\.addr|` +
	`ingest\[\]\.(name|route\.(sink|destination|allowed_sinks|allowed_destinations)|` +
	`(nats|kafka|rabbitmq)\.(url|brokers|topic|group|queue|subject|stream|bindings(\[\]\..*)?))|` +
	`sinks\[\]\.(name|(nats|kafka|rabbitmq)\.(url|brokers)))$`)

func exampleFile(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config.example.yaml")) // go test runs in the package's directory
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// config.example.yaml is what its header says: every value shown is the
// default, unless it is an example by nature (exampleIsExample) or its
// comment says "example". Each key is taken out in turn: when the file
// still reads the same, the value shown was the default.
func TestExampleShowsTheDefaults(t *testing.T) {
	data := exampleFile(t)
	full, err := config.Parse(data, noEnv)
	if err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
	lines := strings.Split(string(data), "\n")
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			walk(n.Content[0], path)
		case yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, path+"[]")
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := join(path, k.Value)
				if v.Kind == yaml.MappingNode || (v.Kind == yaml.SequenceNode && len(v.Content) > 0 && v.Content[0].Kind == yaml.MappingNode) {
					walk(v, p)
					continue
				}
				if exampleIsExample.MatchString(p) || strings.Contains(commentAt(lines, k.Line), "example") {
					continue
				}
				// Without the key, does the file read the same?
				saved := n.Content
				n.Content = append(slices.Clone(n.Content[:i]), n.Content[i+2:]...)
				out, err := yaml.Marshal(&doc)
				n.Content = saved
				if err != nil {
					t.Fatal(err)
				}
				without, err := config.Parse(out, noEnv)
				if err != nil || !reflect.DeepEqual(full, without) {
					t.Errorf("config.example.yaml line %d: %s: `%s` is not the default (without the key the file reads otherwise): show the default, or mark the value `# example` (%v)",
						k.Line, p, strings.TrimSpace(strings.SplitN(lines[k.Line-1], " #", 2)[0]), err)
				}
			}
		}
	}
	walk(&doc, "")
}

// commentAt is the comment of line n (1-based) and the comment lines that
// continue it below, in the same column.
func commentAt(lines []string, n int) string {
	if n < 1 || n > len(lines) {
		return ""
	}
	l := lines[n-1]
	col := strings.Index(l, " #")
	if col < 0 {
		return ""
	}
	col++
	text := l[col:]
	for _, next := range lines[n:] {
		if len(next) <= col || next[col] != '#' || strings.TrimSpace(next[:col]) != "" {
			break
		}
		text += " " + next[col:]
	}
	return text
}

// Every key of the configuration is shown in config.example.yaml, set or
// in a comment: its name is in the file.
func TestExampleShowsEveryKey(t *testing.T) {
	text := string(exampleFile(t))
	var walk func(tp reflect.Type, path string)
	walk = func(tp reflect.Type, path string) {
		for tp.Kind() == reflect.Pointer || tp.Kind() == reflect.Slice {
			tp = tp.Elem()
		}
		if tp.Kind() != reflect.Struct || tp == reflect.TypeOf(config.Duration(0)) {
			return
		}
		for i := 0; i < tp.NumField(); i++ {
			f := tp.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			switch {
			case !f.IsExported():
			case opts == "inline":
				walk(f.Type, path)
			case name == "" || name == "-":
			default:
				p := join(path, name)
				if !regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).MatchString(text) {
					t.Errorf("config.example.yaml does not show the key %s", p)
				}
				walk(f.Type, p)
			}
		}
	}
	walk(reflect.TypeOf(config.Config{}), "")
	for _, k := range config.BrokerKinds() {
		data := []byte("redis: {addr: \"a:1\"}\ningest: [{name: i, " + k + ": {}, route: {sink: s, destination: d}}]\nsinks: [{name: s, " + k + ": {}}]\n")
		var cfg config.Config
		if err := yaml.Unmarshal(data, &cfg); err != nil {
			t.Fatal(err)
		}
		walk(reflect.TypeOf(cfg.Ingest[0].Broker), "ingest[]."+k)
		walk(reflect.TypeOf(cfg.Sinks[0].Broker), "sinks[]."+k)
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
