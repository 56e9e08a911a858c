package serveopts

import "github.com/ratelimitd/ratelimitd/internal/gcpolicy"

// ChooseGC is gcpolicy.Choose on the GC flags of o; a setting that came
// from a RATELIMITD_* twin is logged as such.
func ChooseGC(o Options, lookup func(string) (string, bool), cgroupLimit func() (uint64, error), current func() (int, int64)) (gcpolicy.Policy, error) {
	s := gcpolicy.Settings{Percent: o.GCPercent, MemoryLimit: int64(o.MemoryLimit), MemoryLimitRatio: o.MemoryLimitRatio,
		SetBy: func(name, value string) string {
			s := "--" + name + "=" + value
			if v, ok := o.fromEnv[name]; ok {
				s += " from " + v
			}
			return s
		}}
	return gcpolicy.Choose(s, lookup, cgroupLimit, current)
}
