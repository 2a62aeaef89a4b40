//go:build race

package e2e

// raceEnabled says the race detector is on: allocation counts mean nothing.
const raceEnabled = true
