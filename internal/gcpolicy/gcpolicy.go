// Package gcpolicy chooses the Go GC percent and soft memory limit of
// `ratelimitd serve` from its flags, GOGC and GOMEMLIMIT, and the cgroup
// memory limit, applies them and logs where each came from
// (docs/operations.md, "Go GC and memory limit").
package gcpolicy

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

// A GC target above Go's default cuts the CPU the collector takes from a
// service that allocates per call (BENCHMARKS.md); the heap may then grow
// to several times the live heap, so the policy pairs it with a soft
// memory limit below the container's, near which the GC runs as often as
// needed whatever the percent.
const (
	// DefaultPercent is --gc-percent's default.
	DefaultPercent = 400
	// DefaultMemoryLimitRatio is --memory-limit-ratio's default: the Go
	// heap limit leaves 20 % of the cgroup limit for what the Go limit does
	// not bound tightly (goroutine stacks and runtime overhead are counted,
	// but the kernel's page cache and a heap briefly above a soft limit
	// are not).
	DefaultMemoryLimitRatio = 0.8
)

// Sources of the GC settings, as logged at startup.
const (
	SourceEnv    = "env"    // GOGC or GOMEMLIMIT: the Go runtime applied it
	SourceFlag   = "flag"   // --gc-percent or --memory-limit (or its default)
	SourceCgroup = "cgroup" // --memory-limit-ratio × the cgroup memory limit
	SourceNone   = "none"   // no memory limit
)

// NoMemoryLimit is the Go runtime's "no limit" (debug.SetMemoryLimit).
const NoMemoryLimit = math.MaxInt64

// Policy is the GC percent and soft memory limit chosen at startup, with
// where each came from.
type Policy struct {
	Percent       int    // GC target percent; -1 = GC off
	PercentSource string // SourceEnv or SourceFlag
	Limit         int64  // soft memory limit in bytes; NoMemoryLimit = none
	LimitSource   string // SourceEnv, SourceFlag, SourceCgroup or SourceNone
	// Cgroup is the cgroup memory limit in bytes when it was read (0
	// otherwise).
	Cgroup uint64
	// CgroupNote says why no cgroup limit was used ("" when Cgroup is set
	// or the cgroup was not consulted).
	CgroupNote string
	// PercentBy and LimitBy name the setting each came from and its value,
	// as logged: "GOGC=150", "--gc-percent=400", or
	// "--memory-limit=300MiB from RATELIMITD_MEMORY_LIMIT" for a twin.
	PercentBy, LimitBy string
}

// Settings are the GC flags of `ratelimitd serve`.
type Settings struct {
	Percent          int     // --gc-percent; -1 turns the GC off
	MemoryLimit      int64   // --memory-limit in bytes; 0: derive from the cgroup
	MemoryLimitRatio float64 // --memory-limit-ratio of the cgroup limit; 0: none
	// SetBy describes the flag name set to value, as logged
	// ("--gc-percent=400 from RATELIMITD_GC_PERCENT"); nil gives
	// "--name=value".
	SetBy func(name, value string) string
}

func (s Settings) setBy(name, value string) string {
	if s.SetBy != nil {
		return s.SetBy(name, value)
	}
	return "--" + name + "=" + value
}

// Choose decides the GC policy without changing the runtime: GOGC, when
// set and non-empty, wins over --gc-percent; GOMEMLIMIT over --memory-limit,
// which wins over --memory-limit-ratio × cgroupLimit(). The values of the
// environment variables are read back from the runtime (current, e.g.
// Runtime), which parsed them at start. cgroupLimit is memlimit.FromCgroup
// in production; memlimit.ErrNoLimit or any other error means no cgroup
// limit (noted, not fatal). It fails when --gc-percent=-1 (GC off) would
// run without a memory limit.
func Choose(o Settings, lookup func(string) (string, bool), cgroupLimit func() (uint64, error), current func() (int, int64)) (Policy, error) {
	envSet := func(name string) bool { v, ok := lookup(name); return ok && v != "" }
	curPercent, curLimit := current()
	p := Policy{Percent: o.Percent, PercentSource: SourceFlag, Limit: NoMemoryLimit, LimitSource: SourceNone,
		PercentBy: o.setBy("gc-percent", strconv.Itoa(o.Percent)),
		LimitBy:   o.setBy("memory-limit-ratio", strconv.FormatFloat(o.MemoryLimitRatio, 'g', -1, 64))}
	if envSet("GOGC") {
		v, _ := lookup("GOGC")
		p.Percent, p.PercentSource, p.PercentBy = curPercent, SourceEnv, "GOGC="+v
	}
	switch {
	case envSet("GOMEMLIMIT"):
		v, _ := lookup("GOMEMLIMIT")
		p.Limit, p.LimitSource, p.LimitBy = curLimit, SourceEnv, "GOMEMLIMIT="+v
	case o.MemoryLimit > 0:
		p.Limit, p.LimitSource = o.MemoryLimit, SourceFlag
		p.LimitBy = o.setBy("memory-limit", FormatBytes(o.MemoryLimit))
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
			p.Limit, p.LimitSource = NoMemoryLimit, SourceCgroup
			if l < NoMemoryLimit {
				p.Limit = int64(l)
			}
		}
	}
	if p.PercentSource == SourceFlag && p.Percent < 0 && p.Limit == NoMemoryLimit {
		return p, errors.New("--gc-percent=-1 turns the GC off and needs a memory limit: set --memory-limit or GOMEMLIMIT, or run in a cgroup with a memory limit and --memory-limit-ratio > 0")
	}
	return p, nil
}

// Apply sets what the runtime did not already take from the environment:
// debug.SetMemoryLimit for a flag or cgroup limit, debug.SetGCPercent for
// the flag's percent.
func (p Policy) Apply() {
	if p.LimitSource == SourceFlag || p.LimitSource == SourceCgroup {
		debug.SetMemoryLimit(p.Limit)
	}
	if p.PercentSource == SourceFlag {
		debug.SetGCPercent(p.Percent)
	}
}

// Log reports the policy at startup, at info.
func (p Policy) Log(log *slog.Logger) {
	attrs := []any{"gc_percent", p.Percent, "gc_percent_source", p.PercentSource, "gc_percent_set_by", p.PercentBy}
	if p.Limit == NoMemoryLimit {
		attrs = append(attrs, "memory_limit", "none")
	} else {
		attrs = append(attrs, "memory_limit", FormatBytes(p.Limit), "memory_limit_bytes", p.Limit)
	}
	attrs = append(attrs, "memory_limit_source", p.LimitSource, "memory_limit_set_by", p.LimitBy)
	if p.Cgroup > 0 {
		attrs = append(attrs, "cgroup_memory_limit_bytes", p.Cgroup)
	}
	if p.CgroupNote != "" {
		attrs = append(attrs, "cgroup", p.CgroupNote)
	}
	log.Info("go gc policy", attrs...)
	if p.Percent < 0 && p.Limit == NoMemoryLimit {
		// Only GOGC=off gets here (--gc-percent=-1 is refused without a
		// limit): the runtime's choice, but the heap grows without bound.
		log.Warn("GOGC=off without a memory limit: the heap is never collected and grows until the process is killed; set GOMEMLIMIT or --memory-limit")
	}
}

// Runtime reads the GC percent and soft memory limit in force from
// runtime/metrics (GOGC "off" reads -1; no limit reads math.MaxInt64).
func Runtime() (int, int64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	percent, limit := -1, int64(NoMemoryLimit)
	if s[0].Value.Kind() == metrics.KindUint64 {
		if v := s[0].Value.Uint64(); v <= math.MaxInt32 {
			percent = int(v)
		}
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		if v := s[1].Value.Uint64(); v < NoMemoryLimit {
			limit = int64(v)
		}
	}
	return percent, limit
}

// MinMemoryLimit is the smallest --memory-limit accepted (0 aside): the
// service's own heap is several MiB before any key is stored.
const MinMemoryLimit = 16 << 20

// ByteSize is a flag.Value of bytes (--memory-limit: 0, or at least
// MinMemoryLimit): a non-negative number (decimals
// allowed) with an optional unit, case-insensitive: B; KiB, MiB, GiB, TiB
// (or Ki, Mi, Gi, Ti as in Kubernetes quantities) are powers of 1024; KB,
// MB, GB, TB (or K, M, G, T) powers of 1000. "400MiB" = 419430400.
type ByteSize int64

// String is b as FormatBytes prints it ("0" for nil).
func (b *ByteSize) String() string {
	if b == nil {
		return "0"
	}
	return FormatBytes(int64(*b))
}

// Set parses s (ParseBytes) and refuses a limit below MinMemoryLimit.
func (b *ByteSize) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	if n > 0 && n < MinMemoryLimit {
		return fmt.Errorf("%q is below %s: a soft memory limit that small makes the GC run all the time (is a unit missing? e.g. 400MiB)", s, FormatBytes(MinMemoryLimit))
	}
	*b = ByteSize(n)
	return nil
}

var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
	"ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40,
}

// ParseBytes parses a ByteSize; it rejects negative and too-large values
// (beyond int64) and unknown units. Whole numbers are exact; fractions of
// a byte (1.5 KB = 1500, 0.3 KiB = 307) are dropped.
func ParseBytes(s string) (int64, error) {
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

// FormatBytes prints n with the largest binary unit that divides it
// exactly (419430400 → "400MiB"), else in bytes; ParseBytes reads it back.
func FormatBytes(n int64) string {
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
