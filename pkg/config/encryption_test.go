package config_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/pkg/config"
)

// Two valid keys (32 bytes each) and one too short (16 bytes).
var (
	encK1    = base64.StdEncoding.EncodeToString([]byte("k1-0123456789abcdef0123456789abc"))
	encK2    = base64.StdEncoding.EncodeToString([]byte("k2-0123456789abcdef0123456789abc"))
	encShort = base64.StdEncoding.EncodeToString([]byte("short-0123456789"))
)

func withEncryption(section string) []byte { return []byte(minimal + section) }

func TestEncryptionOffWhenAbsent(t *testing.T) {
	for _, extra := range []string{"", "encryption:\n"} {
		cfg, err := config.Parse(withEncryption(extra), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Encryption != nil {
			t.Fatalf("%q: encryption %+v, want nil (off)", extra, cfg.Encryption)
		}
	}
}

func TestEncryptionFromEnvAndFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "k2")
	if err := os.WriteFile(file, []byte(encK2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"ENC_K1": encK1}
	cfg, err := config.Parse(withEncryption(fmt.Sprintf(`
encryption:
  active_key: k2
  keys:
    - {id: k1, key: "${ENC_K1}"}
    - {id: k2, key_file: %q}
`, file)), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	e := cfg.Encryption
	if e == nil || e.ActiveKey != "k2" || len(e.Keys) != 2 {
		t.Fatalf("encryption %+v", e)
	}
	if e.Keys[0].ID != "k1" || e.Keys[0].Key.Reveal() != encK1 {
		t.Errorf("k1 from the environment: %q", e.Keys[0].Key.Reveal())
	}
	if e.Keys[1].ID != "k2" || e.Keys[1].Key.Reveal() != encK2 {
		t.Errorf("k2 from the file (newline trimmed): %q", e.Keys[1].Key.Reveal())
	}

	// The keys never show in any printed form.
	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "cfg", cfg, "enc", e)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "enc", e)
	js, _ := json.Marshal(cfg)
	ys, _ := yaml.Marshal(cfg)
	for form, text := range map[string]string{
		"%v": fmt.Sprintf("%v", *e), "%+v": fmt.Sprintf("%+v", *e), "%#v": fmt.Sprintf("%#v", *e),
		"json": string(js), "yaml": string(ys), "slog": logged.String(),
	} {
		for _, k := range []string{encK1, encK2, encK1[:16], encK2[:16]} {
			if strings.Contains(text, k) {
				t.Errorf("a key is printed in %s form", form)
			}
		}
	}
}

func TestEncryptionProblems(t *testing.T) {
	dir := t.TempDir()
	shortFile := filepath.Join(dir, "short")
	if err := os.WriteFile(shortFile, []byte(encShort), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyFile := filepath.Join(dir, "empty")
	if err := os.WriteFile(emptyFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		section string
		want    []string // "path: message fragment"
	}{
		{"no keys", "encryption: {active_key: k1}", []string{
			"encryption.keys: at least one key is required",
			`encryption.active_key: "k1" is not the id of a key`,
		}},
		{"empty section", "encryption: {}", []string{
			"encryption.keys: at least one key is required",
			"encryption.active_key: required",
		}},
		{"no active key", fmt.Sprintf("encryption: {keys: [{id: k1, key: %q}]}", encK1), []string{
			"encryption.active_key: required",
		}},
		{"active key unknown", fmt.Sprintf("encryption: {active_key: k3, keys: [{id: k1, key: %q}]}", encK1), []string{
			`encryption.active_key: "k3" is not the id of a key in encryption.keys`,
		}},
		{"duplicate id", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key: %q}, {id: k1, key: %q}]}", encK1, encK2), []string{
			`encryption.keys[1].id: "k1" is used by another key`,
		}},
		{"missing id", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key: %q}, {key: %q}]}", encK1, encK2), []string{
			"encryption.keys[1].id: required",
		}},
		{"bad id", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key: %q}, {id: \"a b\", key: %q}]}", encK1, encK2), []string{
			`encryption.keys[1].id: "a b" must be 1 to 64 letters`,
		}},
		{"no key", "encryption: {active_key: k1, keys: [{id: k1}]}", []string{
			"encryption.keys[0].key: required",
		}},
		{"not base64", "encryption: {active_key: k1, keys: [{id: k1, key: \"not*base64*0123456789\"}]}", []string{
			"encryption.keys[0].key: not valid standard base64",
		}},
		{"url-safe base64 is not std", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key: %q}]}",
			base64.URLEncoding.EncodeToString([]byte("\xff\xfe\xfd0123456789abcdef0123456789ab"))), []string{
			"encryption.keys[0].key: not valid standard base64",
		}},
		{"16 bytes", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key: %q}]}", encShort), []string{
			"encryption.keys[0].key: decodes to 16 bytes; AES-256 needs 32",
		}},
		{"16 bytes in a file", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key_file: %q}]}", shortFile), []string{
			"encryption.keys[0].key_file: decodes to 16 bytes; AES-256 needs 32",
		}},
		{"key and key_file", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key: %q, key_file: %q}]}", encK1, shortFile), []string{
			"encryption.keys[0].key_file: give key or key_file, not both",
		}},
		{"unreadable key_file", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key_file: %q}]}", filepath.Join(dir, "missing")), []string{
			"encryption.keys[0].key_file: cannot read",
			"encryption.keys[0].key_file: gave no key",
		}},
		{"empty key_file", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, key_file: %q}]}", emptyFile), []string{
			"encryption.keys[0].key_file: gave no key (the file is empty",
		}},
		{"unknown field", fmt.Sprintf("encryption: {active_key: k1, keys: [{id: k1, secret: %q}]}", encK1), []string{
			"encryption.keys[0].secret: unknown key",
		}},
		{"keys not a list", "encryption: {active_key: k1, keys: k1}", []string{
			"encryption.keys: expected a list",
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Parse(withEncryption(c.section+"\n"), noEnv)
			var ps config.Problems
			if !errors.As(err, &ps) {
				t.Fatalf("Parse = %v, want Problems", err)
			}
			text := ps.Error()
			for _, w := range c.want {
				if !strings.Contains(text, w) {
					t.Errorf("problems do not contain %q:\n%s", w, text)
				}
			}
			if strings.Contains(text, "decodes to 0 bytes") {
				t.Errorf("a key that was not given is said to decode to 0 bytes:\n%s", text)
			}
			for _, k := range []string{encK1, encK2, encShort} {
				if strings.Contains(text, k) {
					t.Errorf("a key value is in the problems:\n%s", text)
				}
			}
		})
	}
}
