//go:build race

package testenv

// raceEnabled is true when the test binary was built with -race; BuildPackage then
// builds with -race too.
const raceEnabled = true
