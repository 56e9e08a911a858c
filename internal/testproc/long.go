package testproc

import "os"

// LongEnv is the environment variable that selects the long variants of
// the process-level suites (`make test-long` sets it to 1): every
// repetition of the fault and fleet runs. Without it (`make test`) they
// run their quick variants, which still exercise every fault, topology
// and burst shape at least once.
const LongEnv = "RATELIMITD_LONG"

// Long reports whether LongEnv is set to 1.
func Long() bool { return os.Getenv(LongEnv) == "1" }

// Reps is long when Long, else quick: the repetitions of a run.
func Reps(quick, long int) int {
	if Long() {
		return long
	}
	return quick
}
