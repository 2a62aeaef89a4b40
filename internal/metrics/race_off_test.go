//go:build !race

package metrics

// raceEnabled reports whether the race detector is on (it makes allocation
// counts meaningless).
const raceEnabled = false
