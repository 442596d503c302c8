//go:build race

package router

// raceOn: the race detector is on (sync.Pool then drops entries at random,
// so allocation counts are not the build's).
const raceOn = true
