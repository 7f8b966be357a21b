package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/seal"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// encryptionSection is the YAML of an encryption section: active key and
// key lines.
func encryptionSection(active string, keys ...string) string {
	return fmt.Sprintf("encryption:\n  active_key: %s\n  keys:\n    - %s\n", active, strings.Join(keys, "\n    - "))
}

// rawPools reads every pool of the e2e key prefix straight from Redis.
func rawPools(t *testing.T, rdb *redis.Client) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for shard := 0; shard < 16; shard++ {
		m, err := rdb.HGetAll(context.Background(), fmt.Sprintf("e2e:{%d}:pool", shard)).Result()
		if err != nil {
			t.Fatal(err)
		}
		for id, blob := range m {
			out[id] = []byte(blob)
		}
	}
	return out
}

// checkSealedWith asserts that every given message is in Redis, sealed with
// keyID, with none of the secret strings in clear.
func checkSealedWith(t *testing.T, rdb *redis.Client, keyID string, ids []string, secrets ...string) {
	t.Helper()
	pools := rawPools(t, rdb)
	for _, id := range ids {
		blob, ok := pools[id]
		if !ok {
			t.Fatalf("%s is not in Redis", id)
		}
		k, sealed, err := envelope.SealedKeyID(blob)
		if err != nil || !sealed || k != keyID {
			t.Fatalf("%s: sealed %v with %q (%v), want %q", id, sealed, k, err, keyID)
		}
		for _, s := range secrets {
			if bytes.Contains(blob, []byte(s)) {
				t.Fatalf("%s: %q in clear in Redis", id, s)
			}
		}
	}
}

// TestEncryptionEndToEnd runs the real binary with encryption on: parked
// messages are sealed in Redis and fire with body and headers intact; after
// a rotation (k1 -> k2) and `delaybridge reencrypt`, a daemon with only k2
// fires the messages parked under k1; a message sealed with a key the daemon
// does not have becomes dead with the reason.
func TestEncryptionEndToEnd(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	k1 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	k2 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
	k2File := filepath.Join(t.TempDir(), "k2")
	if err := os.WriteFile(k2File, []byte(k2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := "ENC_K1=" + k1
	keyK1 := `{id: k1, key: "${ENC_K1}"}`
	keyK2 := fmt.Sprintf("{id: k2, key_file: %q}", k2File)

	e := newNATSEnv(t, "", encryptionSection("k1", keyK1), env)
	rdb := e.redis.Client()
	const secretBody, secretHeader = "BODY-SECRET-", "HEADER-SECRET-"

	// Short delays: they fire with the body and headers intact.
	var soon []string
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("soon-%d", i)
		soon = append(soon, id)
		e.publish("delayed.x", []byte(secretBody+id), "x-delay", "1500ms", "x-message-id", id, "x-secret", secretHeader+id)
	}
	// Long delays: they stay parked through the rotation.
	var later []string
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("later-%d", i)
		later = append(later, id)
		e.publish("delayed.x", []byte(secretBody+id), "x-delay", "1h", "x-message-id", id, "x-secret", secretHeader+id)
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		pools := rawPools(t, rdb)
		for _, id := range later {
			if pools[id] == nil {
				return false
			}
		}
		return true
	}, "not parked")
	checkSealedWith(t, rdb, "k1", later, secretBody, secretHeader, "x-secret")

	e.waitFired(20*time.Second, soon...)
	checkFired := func(ids []string) {
		t.Helper()
		for _, id := range ids {
			f := e.firedCopies(id)[0]
			if string(f.body) != secretBody+id {
				t.Fatalf("%s fired with body %q", id, f.body)
			}
			if v := f.headers.Get("x-secret"); v != secretHeader+id {
				t.Fatalf("%s fired with x-secret %q", id, v)
			}
		}
	}
	checkFired(soon)

	// Rotate: k2 becomes active, k1 stays to read; reencrypt while the
	// daemon is stopped (it is safe while it runs, too).
	e.d.stop()
	rotated := e.config("") + encryptionSection("k2", keyK1, keyK2)
	rotatedPath := filepath.Join(t.TempDir(), "rotated.yaml")
	if err := os.WriteFile(rotatedPath, []byte(strings.ReplaceAll(rotated, "%ADMIN%", "127.0.0.1:0")), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProcessWith(t, testenv.ProcessOptions{Env: []string{env}}, testenv.Build(t), "reencrypt", "-c", rotatedPath)
	if code := p.Wait(60 * time.Second); code != 0 {
		t.Fatalf("reencrypt exit %d:\n%s", code, p.Output())
	}
	if want := "re-encrypted 20 (0 of them were in clear), already current 0, failed to decrypt 0, changed meanwhile 0"; !strings.Contains(p.Output(), want) {
		t.Fatalf("reencrypt printed %q, want %q", p.Output(), want)
	}
	checkSealedWith(t, rdb, "k2", later, secretBody, secretHeader)

	// A daemon with only k2 reads everything; bring the parked messages'
	// due time forward so they fire now.
	e.d = startDaemon(t, e.config("")+encryptionSection("k2", keyK2))
	for _, id := range later {
		due := fmt.Sprintf("e2e:{%d}:due", store.ShardOf(id, 16))
		z := redis.Z{Score: float64(time.Now().UnixMilli()), Member: id}
		if n, err := rdb.ZAddArgs(context.Background(), due, redis.ZAddArgs{XX: true, Ch: true, Members: []redis.Z{z}}).Result(); err != nil || n != 1 {
			t.Fatalf("ZADD XX %s %s: %d %v", due, id, n, err)
		}
	}
	e.waitFired(20*time.Second, later...)
	checkFired(later)

	// A message sealed with a key the daemon does not have is not dropped:
	// it is dead with the reason.
	k9, err := seal.New("k9", []seal.Key{{ID: "k9", Secret: bytes.Repeat([]byte{9}, 32)}})
	if err != nil {
		t.Fatal(err)
	}
	other := store.New(rdb, store.Options{Prefix: "e2e", Shards: 16, Sealer: k9})
	orphan := &envelope.Message{ID: "orphan", DueAt: time.Now(), Sink: "out", Destination: "fired.default", Body: []byte(secretBody)}
	if _, err := other.Park(context.Background(), []*envelope.Message{orphan}); err != nil {
		t.Fatal(err)
	}
	want := `sealed with key "k9", which is not configured`
	var dead deadMessage
	testenv.Eventually(t, 15*time.Second, func() bool {
		for _, d := range e.d.dead() {
			if d.ID == "orphan" && strings.Contains(d.Reason, want) {
				dead = d
				return true
			}
		}
		return false
	}, "a message sealed with an unknown key is not dead with the reason")
	// The dead list and the log show where it went, which is kept in clear.
	if dead.Sink != "out" || dead.Destination != "fired.default" {
		t.Errorf("the dead record of a message sealed with an unknown key: sink %q destination %q, want out, fired.default", dead.Sink, dead.Destination)
	}
	e.d.proc.WaitOutput(10*time.Second, `sink=out destination=fired.default id=orphan`)
	if n := len(e.firedCopies("orphan")); n != 0 {
		t.Fatalf("orphan fired %d times", n)
	}
	// inspect shows what is stored in clear of it (its due time and route)
	// and says in its exit status that the content asked for cannot be read.
	out, err := exec.Command(e.d.bin, "inspect", "-c", e.d.cfgPath, "--body", "orphan").CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 || !strings.Contains(string(out), "fired.default") ||
		!strings.Contains(string(out), "cannot be read") || strings.Contains(string(out), secretBody) {
		t.Errorf("inspect --body of a message sealed with an unknown key: %v\n%s", err, out)
	}
	e.d.stop()
}

// A start checks its keys against a sample of what the store holds: a key
// whose bytes are not those that sealed the messages under its ID stops
// the start (the instance would kill each such message it claims, and seal
// new ones the others cannot open); messages sealed with a key ID not
// configured are named in a warning.
func TestWrongKeyStopsTheStart(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	k1 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	other := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	e := newNATSEnv(t, "", encryptionSection("k1", fmt.Sprintf("{id: k1, key: %q}", k1)))
	for i := range 5 {
		id := fmt.Sprintf("parked-%d", i)
		e.publish("delayed.x", []byte("secret"), "x-delay", "1h", "x-message-id", id)
	}
	rdb := e.redis.Client()
	testenv.Eventually(t, 20*time.Second, func() bool { return len(rawPools(t, rdb)) == 5 }, "the messages were not parked")
	e.d.stop()

	wrong := strings.ReplaceAll(e.config("")+encryptionSection("k1", fmt.Sprintf("{id: k1, key: %q}", other)), "%ADMIN%", "127.0.0.1:0")
	path := filepath.Join(t.TempDir(), "wrong.yaml")
	if err := os.WriteFile(path, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProcess(t, testenv.Build(t), "run", "-c", path)
	if code := p.Wait(60 * time.Second); code == 0 || !strings.Contains(p.Output(), `key "k1" opens none of the 5 live messages sampled`) {
		t.Fatalf("a daemon with other bytes under k1: exit %d, want a refusal naming k1:\n%s", code, p.Output())
	}

	k3 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))
	d := startDaemon(t, e.config("")+encryptionSection("k3", fmt.Sprintf("{id: k3, key: %q}", k3)))
	d.proc.WaitOutput(10*time.Second, `keys=[k1]`)
	d.stop()
	if pools := rawPools(t, rdb); len(pools) != 5 {
		t.Fatalf("%d messages left parked, want the 5", len(pools))
	}
}
