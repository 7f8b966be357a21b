package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// make test builds the race daemons Build takes from PrebuiltEnv under the
// names Build looks for: a name of one side only would have every test
// binary link its own again, silently.
func TestMakefileBuildsThePrebuiltDaemons(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), PrebuiltEnv+"=$(TESTBIN)") {
		t.Errorf("the Makefile does not give the tests %s=$(TESTBIN)", PrebuiltEnv)
	}
	if !strings.Contains(string(mk), RaceDaemonEnv+"=1") {
		t.Errorf("the Makefile does not give the black-box tests %s=1: their daemons would run without the race detector", RaceDaemonEnv)
	}
	for _, tags := range [][]string{nil, {"faultinject"}} {
		want := fmt.Sprintf("-o $(TESTBIN)/%s ./cmd/delaybridge", prebuiltName(true, tags))
		if !strings.Contains(string(mk), want) {
			t.Errorf("the Makefile does not build %q (with -race, tags %v)", want, tags)
		}
	}
}
