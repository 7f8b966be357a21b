package cli

import (
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	env := map[string]string{}
	getenv := func(k string) string { return env[k] }

	if !tuneGC(getenv) {
		t.Fatal("GOGC unset: tuneGC did not set the target")
	}
	if now := debug.SetGCPercent(100); now != daemonGCPercent {
		t.Fatalf("GOGC unset: the runtime's target is %d, want %d", now, daemonGCPercent)
	}

	env["GOGC"] = "150"
	if tuneGC(getenv) {
		t.Fatal("GOGC=150: tuneGC overrode the operator's choice")
	}
	if now := debug.SetGCPercent(100); now != 100 {
		t.Fatalf("GOGC=150: the runtime's target changed to %d", now)
	}
}
