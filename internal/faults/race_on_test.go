//go:build race

package faults

// raceEnabled: the tests run with -race, so the ratelimitd binary under
// test is built with -race too (a data race in it fails the test at stop).
const raceEnabled = true
