//go:build race

package testenv

// raceEnabled is true when the test binary was built with -race; the
// daemons Build makes are then built with -race too (raceDaemon).
const raceEnabled = true
