//go:build bench && !race

package bench

const raceEnabled = false
