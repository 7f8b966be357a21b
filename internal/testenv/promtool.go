package testenv

import "testing"

// Promtool returns the path of promtool, Prometheus's rule checker, which Debian ships
// in its prometheus package (scripts/test-deps.sh installs it). Like the servers, a
// missing promtool fails the test with a hint to run scripts/test-deps.sh.
func Promtool(t testing.TB) string {
	skipShort(t, "promtool")
	t.Helper()
	return lookBinary(t, "promtool", "/usr/bin/promtool")
}
