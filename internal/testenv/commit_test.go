package testenv

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A commit the clone does not hold is a failure that says what to do,
// never a skip: most often a shallow CI checkout.
func TestBuildCommitNamesWhatToDo(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.Command("git", "-C", root, "rev-parse", "--git-dir").Output(); err != nil {
		t.Fatalf("the module is not in a git clone: %v", err)
	}
	head, err := resolveCommit(root, "HEAD")
	if err != nil || len(head) != 40 {
		t.Fatalf("HEAD resolves to %q, %v", head, err)
	}
	_, err = resolveCommit(root, strings.Repeat("0", 39)+"1")
	if err == nil || !strings.Contains(err.Error(), "does not hold commit") || !strings.Contains(err.Error(), "git fetch") {
		t.Errorf("a commit not in the clone: %v", err)
	}

	// A shallow clone of one commit: its parent is missing.
	shallow := filepath.Join(t.TempDir(), "shallow")
	if out, err := exec.Command("git", "clone", "-q", "--depth", "1", "file://"+root, shallow).CombinedOutput(); err != nil {
		t.Fatalf("git clone --depth 1: %v\n%s", err, out)
	}
	_, err = resolveCommit(shallow, "HEAD~1")
	if err == nil || !strings.Contains(err.Error(), "git fetch --unshallow") {
		t.Errorf("a commit beyond a shallow clone's depth: %v", err)
	}
}
