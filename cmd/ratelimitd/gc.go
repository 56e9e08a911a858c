package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// GC policy of `ratelimitd serve` (docs/operations.md, "Go GC and memory
// limit"). The service allocates per gRPC call and the GC was ≈ 20 % of its
// CPU at Go's default GOGC=100; GOGC=400 cut CPU per decision to ≈ 0.76×
// (BENCHMARKS.md). A larger GC target lets the heap grow to 5× the live heap
// (the memory backend holds up to ≈ 130 MB of keys), so the policy pairs it
// with a soft memory limit below the container's: near the limit the GC
// runs as often as needed, whatever the percent.
const (
	// defaultGCPercent is --gc-percent's default.
	defaultGCPercent = 400
	// defaultMemoryLimitRatio is --memory-limit-ratio's default: the Go
	// heap limit leaves 20 % of the cgroup limit for what the Go limit does
	// not bound tightly (goroutine stacks and runtime overhead are counted,
	// but the kernel's page cache and a heap briefly above a soft limit
	// are not).
	defaultMemoryLimitRatio = 0.8
)

// Sources of the GC settings, as logged at startup.
const (
	sourceEnv    = "env"    // GOGC or GOMEMLIMIT: the Go runtime applied it
	sourceFlag   = "flag"   // --gc-percent or --memory-limit (or its default)
	sourceCgroup = "cgroup" // --memory-limit-ratio × the cgroup memory limit
	sourceNone   = "none"   // no memory limit
)

// noMemoryLimit is the Go runtime's "no limit" (debug.SetMemoryLimit).
const noMemoryLimit = math.MaxInt64

// gcPolicy is the GC percent and soft memory limit chosen at startup, with
// where each came from.
type gcPolicy struct {
	Percent       int    // GC target percent; -1 = GC off
	PercentSource string // sourceEnv or sourceFlag
	Limit         int64  // soft memory limit in bytes; noMemoryLimit = none
	LimitSource   string // sourceEnv, sourceFlag, sourceCgroup or sourceNone
	// Cgroup is the cgroup memory limit in bytes when it was read (0
	// otherwise); CgroupNote says why none was used ("" when Cgroup is
	// set or the cgroup was not consulted).
	Cgroup     uint64
	CgroupNote string
	// PercentBy and LimitBy name the setting each came from and its value,
	// as logged: "GOGC=150", "--gc-percent=400", or
	// "--memory-limit=300MiB from RATELIMITD_MEMORY_LIMIT" for a twin.
	PercentBy, LimitBy string
}

// flagSetting is "--name=value", with " from VAR" when the value came
// from an environment variable (a RATELIMITD_* twin).
func flagSetting(o Options, name, value string) string {
	s := "--" + name + "=" + value
	if v, ok := o.fromEnv[name]; ok {
		s += " from " + v
	}
	return s
}

// chooseGC decides the GC policy without changing the runtime: GOGC, when
// set and non-empty, wins over --gc-percent; GOMEMLIMIT over --memory-limit,
// which wins over --memory-limit-ratio × cgroupLimit(). The values of the
// environment variables are read back from the runtime (current), which
// parsed them at start. cgroupLimit is memlimit.FromCgroup in production
// (cgroup v2 memory.max or v1 memory.limit_in_bytes, the most restrictive
// along the hierarchy); memlimit.ErrNoLimit or any other error means no
// cgroup limit (noted, not fatal). It fails when --gc-percent=-1 (GC off)
// would run without a memory limit.
func chooseGC(o Options, lookup func(string) (string, bool), cgroupLimit func() (uint64, error), current func() (int, int64)) (gcPolicy, error) {
	envSet := func(name string) bool { v, ok := lookup(name); return ok && v != "" }
	curPercent, curLimit := current()
	p := gcPolicy{Percent: o.GCPercent, PercentSource: sourceFlag, Limit: noMemoryLimit, LimitSource: sourceNone,
		PercentBy: flagSetting(o, "gc-percent", strconv.Itoa(o.GCPercent)),
		LimitBy:   flagSetting(o, "memory-limit-ratio", strconv.FormatFloat(o.MemoryLimitRatio, 'g', -1, 64))}
	if envSet("GOGC") {
		v, _ := lookup("GOGC")
		p.Percent, p.PercentSource, p.PercentBy = curPercent, sourceEnv, "GOGC="+v
	}
	switch {
	case envSet("GOMEMLIMIT"):
		v, _ := lookup("GOMEMLIMIT")
		p.Limit, p.LimitSource, p.LimitBy = curLimit, sourceEnv, "GOMEMLIMIT="+v
	case o.MemoryLimit > 0:
		p.Limit, p.LimitSource = int64(o.MemoryLimit), sourceFlag
		p.LimitBy = flagSetting(o, "memory-limit", formatBytes(int64(o.MemoryLimit)))
	case o.MemoryLimitRatio > 0:
		n, err := cgroupLimit()
		switch {
		case errors.Is(err, memlimit.ErrNoLimit):
			p.CgroupNote = "the cgroup sets no memory limit"
		case err != nil:
			p.CgroupNote = "no cgroup memory limit: " + err.Error()
		case n == 0:
			p.CgroupNote = "the cgroup memory limit reads 0"
		default:
			p.Cgroup = n
			l := float64(n) * o.MemoryLimitRatio
			p.Limit, p.LimitSource = noMemoryLimit, sourceCgroup
			if l < noMemoryLimit {
				p.Limit = int64(l)
			}
		}
	}
	if p.PercentSource == sourceFlag && p.Percent < 0 && p.Limit == noMemoryLimit {
		return p, errors.New("--gc-percent=-1 turns the GC off and needs a memory limit: set --memory-limit or GOMEMLIMIT, or run in a cgroup with a memory limit and --memory-limit-ratio > 0")
	}
	return p, nil
}

// apply sets what the runtime did not already take from the environment:
// debug.SetMemoryLimit for a flag or cgroup limit, debug.SetGCPercent for
// the flag's percent.
func (p gcPolicy) apply() {
	if p.LimitSource == sourceFlag || p.LimitSource == sourceCgroup {
		debug.SetMemoryLimit(p.Limit)
	}
	if p.PercentSource == sourceFlag {
		debug.SetGCPercent(p.Percent)
	}
}

// log reports the policy at startup, at info.
func (p gcPolicy) log(log *slog.Logger) {
	attrs := []any{"gc_percent", p.Percent, "gc_percent_source", p.PercentSource, "gc_percent_set_by", p.PercentBy}
	if p.Limit == noMemoryLimit {
		attrs = append(attrs, "memory_limit", "none")
	} else {
		attrs = append(attrs, "memory_limit", formatBytes(p.Limit), "memory_limit_bytes", p.Limit)
	}
	attrs = append(attrs, "memory_limit_source", p.LimitSource, "memory_limit_set_by", p.LimitBy)
	if p.Cgroup > 0 {
		attrs = append(attrs, "cgroup_memory_limit_bytes", p.Cgroup)
	}
	if p.CgroupNote != "" {
		attrs = append(attrs, "cgroup", p.CgroupNote)
	}
	log.Info("go gc policy", attrs...)
	if p.Percent < 0 && p.Limit == noMemoryLimit {
		// Only GOGC=off gets here (--gc-percent=-1 is refused without a
		// limit): the runtime's choice, but the heap grows without bound.
		log.Warn("GOGC=off without a memory limit: the heap is never collected and grows until the process is killed; set GOMEMLIMIT or --memory-limit")
	}
}

// runtimeGC reads the GC percent and soft memory limit in force from
// runtime/metrics (GOGC "off" reads -1; no limit reads math.MaxInt64).
func runtimeGC() (int, int64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	percent, limit := -1, int64(noMemoryLimit)
	if s[0].Value.Kind() == metrics.KindUint64 {
		if v := s[0].Value.Uint64(); v <= math.MaxInt32 {
			percent = int(v)
		}
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		if v := s[1].Value.Uint64(); v < noMemoryLimit {
			limit = int64(v)
		}
	}
	return percent, limit
}

// minMemoryLimit is the smallest --memory-limit accepted (0 aside): the
// service's own heap is several MiB before any key is stored.
const minMemoryLimit = 16 << 20

// byteSize is a flag.Value of bytes (--memory-limit: 0, or at least
// minMemoryLimit): a non-negative number (decimals
// allowed) with an optional unit, case-insensitive: B; KiB, MiB, GiB, TiB
// (or Ki, Mi, Gi, Ti as in Kubernetes quantities) are powers of 1024; KB,
// MB, GB, TB (or K, M, G, T) powers of 1000. "400MiB" = 419430400.
type byteSize int64

func (b *byteSize) String() string {
	if b == nil {
		return "0"
	}
	return formatBytes(int64(*b))
}

func (b *byteSize) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	if n > 0 && n < minMemoryLimit {
		return fmt.Errorf("%q is below %s: a soft memory limit that small makes the GC run all the time (is a unit missing? e.g. 400MiB)", s, formatBytes(minMemoryLimit))
	}
	*b = byteSize(n)
	return nil
}

var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
	"ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40,
}

// parseBytes parses a byteSize; it rejects negative and too-large values
// (beyond int64) and unknown units. Whole numbers are exact; fractions of
// a byte (1.5 KB = 1500, 0.3 KiB = 307) are dropped.
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("%q is negative", s)
	}
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := byteUnits[unit]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q in %q (want B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, KB, MB, GB, TB)", t[i:], s)
	}
	if num == "" {
		return 0, fmt.Errorf("no number in %q (want e.g. 400MiB)", s)
	}
	tooLarge := fmt.Errorf("%q is too large", s)
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 63)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return 0, tooLarge
			}
			return 0, fmt.Errorf("bad number in %q", s)
		}
		if int64(n) > math.MaxInt64/mult {
			return 0, tooLarge
		}
		return int64(n) * mult, nil
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("bad number in %q", s)
	}
	if v *= float64(mult); v >= math.MaxInt64 {
		return 0, tooLarge
	}
	if v > 0 && v < 1 {
		return 0, fmt.Errorf("%q is less than one byte", s)
	}
	return int64(v), nil
}

// formatBytes prints n with the largest binary unit that divides it
// exactly (419430400 → "400MiB"), else in bytes; parseBytes reads it back.
func formatBytes(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}
