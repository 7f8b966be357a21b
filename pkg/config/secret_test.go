package config_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
)

const secretValue = "s3cr3t-Value-9f2c"

func TestSecretsFromFilesAndEnv(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte(secretValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TOKEN": "tok-" + secretValue}
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
redis: {addr: "a:1", password_file: %q}
admin: {token: "${TOKEN}"}
sinks:
  - name: k
    kafka: {brokers: ["b:1"], sasl: {mechanism: scram-sha-512, username: u, password_file: %q}, tls: {enabled: true}}
  - name: n
    nats: {url: "nats://x:1", user: u, password_file: %q}
  - name: r
    rabbitmq: {url: "amqps://h/", username: u, password_file: %q, tls: {enabled: true}}
`, pw, pw, pw, pw)), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]config.Secret{
		"redis.password": cfg.Redis.Password, "kafka": cfg.Sinks[0].Broker.(*kafkabroker.SinkConfig).SASL.Password,
		"nats": cfg.Sinks[1].Broker.(*natsbroker.SinkConfig).Password, "rabbitmq": cfg.Sinks[2].Broker.(*rabbitbroker.SinkConfig).Password,
	} {
		if got.Reveal() != secretValue {
			t.Errorf("%s = %q from the file, want %q (trailing newline trimmed)", name, got.Reveal(), secretValue)
		}
	}
	if cfg.Admin.Token.Reveal() != "tok-"+secretValue {
		t.Errorf("token from env = %q", cfg.Admin.Token.Reveal())
	}

	// The value never shows in any printed form of the configuration.
	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "cfg", cfg, "redis", cfg.Redis)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "password", cfg.Redis.Password)
	js, _ := json.Marshal(cfg)
	ys, _ := yaml.Marshal(cfg)
	for form, text := range map[string]string{
		"%v": fmt.Sprintf("%v", cfg), "%+v": fmt.Sprintf("%+v", *cfg), "%#v": fmt.Sprintf("%#v", *cfg),
		"%s": fmt.Sprintf("%s", cfg.Redis.Password), "json": string(js), "yaml": string(ys), "slog": logged.String(),
	} {
		if strings.Contains(text, secretValue) {
			t.Errorf("secret printed in %s form", form)
		}
	}
	if !strings.Contains(string(ys), "***") {
		t.Errorf("yaml form shows no redaction marker:\n%s", ys)
	}
}

func TestSecretProblems(t *testing.T) {
	_, err := config.Parse([]byte(`
redis: {addr: "a:1", password: x, password_file: /nonexistent/pw}
admin: {token_file: /nonexistent/token}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`), noEnv)
	var ps config.Problems
	if !errors.As(err, &ps) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"redis.password_file: give password or password_file, not both", "admin.token_file: cannot read"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

func TestAuthValidation(t *testing.T) {
	_, err := config.Parse([]byte(`
redis: {addr: "a:1", tls: {ca_file: x}}
admin: {tls: {cert_file: c}}
sinks:
  - {name: k, kafka: {brokers: ["b:1"], sasl: {mechanism: gssapi}}}
  - {name: k2, kafka: {brokers: ["b:1"], sasl: {mechanism: plain}}}
  - {name: n, nats: {url: "nats://x:1", token: t, creds_file: /c}}
  - {name: r, rabbitmq: {url: "amqp://h/", external: true}}
  - {name: r2, rabbitmq: {url: "amqp://h/", password: p}}
`), noEnv)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"redis.tls.enabled: TLS settings are given but enabled is false",
		"admin.tls: give both cert_file and key_file",
		`sinks[0].kafka.sasl.mechanism (k): "gssapi" is not one of`,
		"sinks[1].kafka.sasl.username (k2): required", "sinks[1].kafka.sasl.password (k2): required",
		"sinks[2].nats (n): give one way to authenticate",
		"sinks[3].rabbitmq.external (r): SASL EXTERNAL authenticates with the TLS client certificate",
		"sinks[4].rabbitmq.username (r2): required with a password",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
}

// A URL that does not parse is reported without quoting it: it may hold a
// password.
func TestBadURLDoesNotPrintThePassword(t *testing.T) {
	_, err := config.Parse([]byte(`
redis: {addr: "a:1"}
sinks: [{name: r, rabbitmq: {url: "amqp://guest:s3cr/et@host/"}}]
`), noEnv)
	if err == nil || !strings.Contains(err.Error(), "sinks[0].rabbitmq.url (r): not a URL") {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), "s3cr") {
		t.Fatalf("the password is in the error: %v", err)
	}
}
