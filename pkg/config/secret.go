package config

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
)

// Secret is a credential (password, token, key). It prints as "***" in
// every form — fmt verbs, JSON, YAML — so that validate output, logs,
// errors and the admin API cannot leak it; Reveal returns the value.
//
// Every Secret field X may instead be given as a file, in its sibling
// field X_file (password_file, token_file): the file's content, without a
// trailing newline, becomes the value. Give one of the two.
type Secret string

const redacted = "***"

// Reveal returns the secret's value, for the one place that needs it.
func (s Secret) Reveal() string { return string(s) }

// String redacts.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString redacts (%#v).
func (s Secret) GoString() string { return fmt.Sprintf("%q", s.String()) }

// MarshalJSON redacts.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// MarshalYAML redacts.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// MarshalText redacts (slog's text and JSON handlers use it).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

var secretType = reflect.TypeOf(Secret(""))

// loadSecretFiles fills every Secret field X from its sibling X_file field
// when that is set, walking the whole configuration; problems carry the
// field path.
func loadSecretFiles(v reflect.Value, path string, probs *Problems) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			loadSecretFiles(v.Elem(), path, probs)
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			loadSecretFiles(v.Index(i), fmt.Sprintf("%s[%d]", path, i), probs)
		}
	case reflect.Struct:
		t := v.Type()
		files := map[string]int{} // yaml name of X_file -> field index
		for i := 0; i < t.NumField(); i++ {
			if name := yamlName(t.Field(i)); strings.HasSuffix(name, "_file") {
				files[name] = i
			}
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := yamlName(f)
			if f.Type != secretType {
				switch {
				case f.Anonymous && name == "": // ,inline
					loadSecretFiles(v.Field(i), path, probs)
				case name != "":
					loadSecretFiles(v.Field(i), join(path, name), probs)
				case f.Type.Kind() == reflect.Interface && !v.Field(i).IsNil():
					// A broker block (Ingest.Broker, Sink.Broker) sits under its kind's key.
					if b, ok := v.Field(i).Interface().(interface{ Kind() string }); ok {
						loadSecretFiles(v.Field(i).Elem(), join(path, b.Kind()), probs)
					}
				}
				continue
			}
			fi, ok := files[name+"_file"]
			if !ok {
				continue
			}
			file := v.Field(fi).String()
			if file == "" {
				continue
			}
			if v.Field(i).String() != "" {
				probs.Add(join(path, name+"_file"), "give %s or %s_file, not both", name, name)
				continue
			}
			data, err := os.ReadFile(file)
			if err != nil {
				probs.Add(join(path, name+"_file"), "cannot read: %v", err)
				continue
			}
			v.Field(i).SetString(strings.TrimRight(string(data), "\r\n"))
		}
	}
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}
