package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// A start under encryption.require_sealed over messages parked in clear
// says so, and what to run: each would go dead when it comes due.
func TestCheckKeysWarnsOfClearMessagesUnderRequireSealed(t *testing.T) {
	ctx := context.Background()
	st := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "kc", Shards: 2})
	for _, id := range []string{"a", "b", "c"} {
		m := &envelope.Message{ID: id, DueAt: time.Now().Add(time.Hour).Truncate(time.Millisecond), Sink: "s", Destination: "d", Body: []byte("x")}
		if _, err := st.Park(ctx, []*envelope.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	for _, require := range []bool{false, true} {
		var out bytes.Buffer
		enc := &config.Encryption{ActiveKey: "k1", Keys: []config.EncryptionKey{{ID: "k1"}}, RequireSealed: require}
		if err := checkKeys(ctx, st, enc, slog.New(slog.NewTextHandler(&out, nil))); err != nil {
			t.Fatal(err)
		}
		warned := strings.Contains(out.String(), "delaybridge reencrypt") && strings.Contains(out.String(), "in_clear_sampled=3")
		if warned != require {
			t.Fatalf("require_sealed %v over 3 messages in clear: warned %v\n%s", require, warned, out.String())
		}
	}
}
