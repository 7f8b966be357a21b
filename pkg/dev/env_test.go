package dev

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// The env file dev writes points the CLI at its admin API as well as curl:
// sourced, it sets DELAYBRIDGE_ADMIN (the default of --admin) beside
// DELAYBRIDGE_ADMIN_TOKEN (--token's), so that `delaybridge stats` works
// with no flag; without it the CLI answers "no configuration".
func TestEnvFilePointsTheCLIAtTheAdminAPI(t *testing.T) {
	path := filepath.Join(t.TempDir(), EnvFile)
	if err := writeEnv(path, "http://127.0.0.1:7071", "dev-0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", "-c", `. "$1" && printf '%s|%s|%s|%s' "$DB" "$DELAYBRIDGE_ADMIN" "$DELAYBRIDGE_ADMIN_TOKEN" "$AUTH"`, "sh", path).CombinedOutput()
	if err != nil {
		t.Fatalf("sourcing the env file: %v\n%s", err, out)
	}
	want := "http://127.0.0.1:7071|http://127.0.0.1:7071|dev-0123456789abcdef|Authorization: Bearer dev-0123456789abcdef"
	if string(out) != want {
		t.Errorf("the env file sets DB|DELAYBRIDGE_ADMIN|DELAYBRIDGE_ADMIN_TOKEN|AUTH to\n%s\nwant\n%s", out, want)
	}
}
