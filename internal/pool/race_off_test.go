//go:build !race

package pool_test

// raceEnabled reports whether the race detector is on (it makes allocation counts
// meaningless).
const raceEnabled = false
