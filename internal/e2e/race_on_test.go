//go:build race

package e2e

// raceEnabled: the test binary runs with -race, so the ratelimitd binary
// under test is built with -race too.
const raceEnabled = true
