package testenv

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A program built with -race reports a race in the words raceReport looks
// for, and a clean output has no report: StartProcess fails a test on it.
func TestRaceReportFindsADataRace(t *testing.T) {
	skipShort(t, "a race build")
	bin := filepath.Join(t.TempDir(), "racy")
	if out, err := exec.Command("go", "build", "-race", "-o", bin, "./testdata/racy").CombinedOutput(); err != nil {
		t.Fatalf("go build -race ./testdata/racy: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 66 {
		t.Errorf("the racy program ended with %v, want exit status 66 (a race reported)", err)
	}
	report := raceReport(string(out))
	if !strings.HasPrefix(report, raceWarning) || !strings.Contains(report, "main.main") {
		t.Errorf("raceReport of the racy program's output = %q; output:\n%s", report, out)
	}
	if r := raceReport("level=INFO msg=ready\n"); r != "" {
		t.Errorf("raceReport of a clean output = %q, want none", r)
	}
}
