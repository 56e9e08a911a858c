//go:build !race

package faults

// raceEnabled: see race_on_test.go.
const raceEnabled = false
