package policy

import (
	"math"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// rawLimit is a parsed rate_limit object before compilation.
type rawLimit struct {
	line            int
	unit            Unit
	unitSet         bool
	rpu             int64
	unlimited       bool
	name            string
	replaces        []string
	replacesLines   []int
	algorithm       algo.Kind
	algoSet         bool
	burst           int64
	mult            int64
	failure         FailureMode
	consistency     Consistency
	consistencyLine int
	calendar        bool
	ok              bool
	nameLine        int
	calendarLine    int
	burstLine       int
	rpuLine         int
	multLine        int
	algorithmLine   int
	unlimitedLine   int
	extensionFields []string
	earlyWarning    EarlyWarning
	earlyLine       int
	store           StoreKind
	storeLine       int
}

// limit parses one rate_limit object; line is where it starts (the
// `rate_limit:` key, or the rate_limits item). ok is false when the object
// had a problem (reported to p.errs).
func (p *parser) limit(v *yaml.Node, line int, where string) (rawLimit, bool) {
	l := rawLimit{line: line, mult: 1, ok: true, earlyWarning: DefaultEarlyWarning}
	if v.Kind != yaml.MappingNode {
		p.errs.add(p.file, v.Line, "%s must be a mapping, got %s", where, kindName(v))
		return l, false
	}
	before := len(p.errs.errs)
	var unit unitField
	p.mapping(v, func(k string, kn, v *yaml.Node) { p.limitField(&l, &unit, k, kn, v) })
	p.limitUnit(&l, unit)
	if !l.unlimited && l.unit.Valid() {
		p.checkLimit(&l)
	}
	if l.name != "" {
		for i, r := range l.replaces {
			if r == l.name {
				p.errs.add(p.file, l.replacesLines[i], "replaces: rate limit %q cannot replace itself", r)
			}
		}
	}
	l.ok = len(p.errs.errs) == before
	return l, l.ok
}

// unitField is the `unit:` of a rate_limit as written: its key line (0
// when absent) and text.
type unitField struct {
	line int
	text string
}

// limitField parses the rate_limit key k (key node kn, value v) into l;
// the unit is kept as written in unit, for limitUnit. The fields that
// envoyproxy/ratelimit does not know are recorded in l.extensionFields.
func (p *parser) limitField(l *rawLimit, unit *unitField, k string, kn, v *yaml.Node) {
	switch k {
	case "unit":
		unit.line = kn.Line
		l.unitSet = true
		unit.text, _ = p.str(v, "unit")
	case "requests_per_unit":
		l.rpuLine = kn.Line
		l.rpu, _ = p.integer(v, "requests_per_unit", 0, MaxRequestsPerUnit)
	case "unlimited":
		l.unlimitedLine = kn.Line
		l.unlimited = p.boolean(v, "unlimited")
	case "name":
		l.nameLine = kn.Line
		l.name, _ = p.str(v, "name")
	case "replaces":
		p.replaces(v, l)
	case "algorithm":
		l.algorithmLine = kn.Line
		if a, ok := p.algorithm(v); ok {
			l.algorithm, l.algoSet = a, true
			l.extensionFields = append(l.extensionFields, k)
		}
	case "burst":
		l.burstLine = kn.Line
		l.burst, _ = p.integer(v, "burst", 1, MaxRequestsPerUnit)
		l.extensionFields = append(l.extensionFields, k)
	case "unit_multiplier":
		l.multLine = kn.Line
		if m, ok := p.integer(v, "unit_multiplier", 1, math.MaxUint32); ok {
			l.mult = m
		}
		l.extensionFields = append(l.extensionFields, k)
	case "failure_mode":
		if f, ok := p.failureMode(v, "failure_mode"); ok {
			l.failure = f
			l.extensionFields = append(l.extensionFields, k)
		}
	case "consistency":
		l.consistencyLine = kn.Line
		s, _ := p.str(v, "consistency")
		switch s {
		case "exact":
			l.consistency = Exact
		case "leased":
			l.consistency = Leased
		default:
			p.errs.add(p.file, v.Line, "invalid consistency %q: want exact or leased", s)
		}
		l.extensionFields = append(l.extensionFields, k)
	case "early_warning":
		l.earlyLine = kn.Line
		l.earlyWarning = p.earlyWarning(v)
		l.extensionFields = append(l.extensionFields, k)
	case "store":
		l.storeLine = kn.Line
		if k, ok := p.store(v); ok {
			l.store = k
			l.extensionFields = append(l.extensionFields, "store")
		}
	case "calendar":
		l.calendarLine = kn.Line
		l.calendar = p.boolean(v, "calendar")
		l.extensionFields = append(l.extensionFields, k)
	default:
		p.unknown(kn, k, "rate_limit", limitHints, limitKeys)
	}
}

// limitUnit sets l.unit from the unit as written, reporting a missing or
// invalid unit, and for an unlimited limit any unit or extension field.
func (p *parser) limitUnit(l *rawLimit, unit unitField) {
	if l.unlimited {
		if l.unitSet && unit.text != "" {
			if _, ok := ParseUnit(unit.text); ok {
				p.errs.add(p.file, unit.line, "should not specify rate limit unit when unlimited")
			} else {
				p.errs.add(p.file, unit.line, "invalid rate limit unit %q", unit.text)
			}
		}
		if len(l.extensionFields) > 0 {
			p.errs.add(p.file, l.unlimitedLine, "unlimited rate_limit must not set %s", strings.Join(l.extensionFields, ", "))
		}
		return
	}
	u, ok := ParseUnit(unit.text)
	switch {
	case !l.unitSet || unit.text == "":
		p.errs.add(p.file, l.line, "invalid rate limit unit '': unit is required (second, minute, hour, day, week, month or year) unless unlimited: true")
	case !ok:
		p.errs.add(p.file, unit.line, "invalid rate limit unit %q: want second, minute, hour, day, week, month or year", unit.text)
	default:
		l.unit = u
	}
}

// checkLimit validates the extension fields of a limit with a valid unit,
// then the compiled algo.Limit against algo's bounds.
func (p *parser) checkLimit(l *rawLimit) {
	before := len(p.errs.errs)
	at := func(line int) int {
		if line == 0 {
			return l.line
		}
		return line
	}
	unit := strings.ToLower(l.unit.String())
	if l.burst != 0 && l.algorithm != algo.TokenBucket {
		p.errs.add(p.file, l.burstLine, "burst applies to algorithm token_bucket only (algorithm is %s)", AlgorithmName(l.algorithm))
	}
	if l.algorithm == algo.SlidingLog && l.rpu > MaxSlidingLogRate {
		p.errs.add(p.file, at(l.rpuLine), "sliding_log keeps one entry per admitted request: requests_per_unit %d is above its bound %d; use algorithm sliding_window for large limits", l.rpu, MaxSlidingLogRate)
	}
	if l.algorithm == algo.Concurrency && l.rpu > algo.MaxConcurrencyRate {
		p.errs.add(p.file, at(l.rpuLine), "concurrency keeps one entry per lease: requests_per_unit %d is above its bound %d", l.rpu, algo.MaxConcurrencyRate)
	}
	if l.calendar {
		if l.unit != Month && l.unit != Year {
			p.errs.add(p.file, l.calendarLine, "calendar: true applies to units month and year only (unit is %s)", unit)
		}
		if l.algorithm != algo.FixedWindow && l.algorithm != algo.SlidingWindow {
			p.errs.add(p.file, l.calendarLine, "calendar: true applies to fixed_window and sliding_window only (algorithm is %s)", AlgorithmName(l.algorithm))
		}
	}
	// leasedOK: consistency: leased is allowed here, so its warning is
	// relevant; after an error about it the warning would only distract.
	leasedOK := l.consistency == Leased
	if l.consistency == Leased && (l.calendar || (l.algorithm != algo.FixedWindow && l.algorithm != algo.SlidingWindow && l.algorithm != algo.TokenBucket)) {
		leasedOK = false
		what := "algorithm is " + AlgorithmName(l.algorithm)
		if l.calendar {
			what = "calendar: true"
		}
		p.errs.add(p.file, l.consistencyLine, "consistency: leased applies to fixed_window, sliding_window and token_bucket without calendar windows (%s); use consistency: exact", what)
	}
	if l.consistency == Leased && l.store == StoreDurable {
		// A lease is charged in the fast store: the limit would lose the
		// durability store: durable asks for.
		leasedOK = false
		p.errs.add(p.file, l.consistencyLine, "consistency: leased is not available with store: durable (leases are charged in the fast store, so the count would not survive its restart); use consistency: exact")
	}
	if leasedOK && l.consistencyLine != 0 && float64(l.unit.Duration())*float64(l.mult) >= float64(time.Hour) {
		p.errs.warn(p.file, l.consistencyLine, "consistency: leased on a window of %s × %d: a restart of Redis denies every leased hit until the window ends (the store cannot know the units it leased before); use consistency: exact for windows of an hour or longer", unit, l.mult)
	}
	if l.earlyLine != 0 && l.earlyWarning.Used > 0 && l.algorithm != algo.FixedWindow && l.algorithm != algo.SlidingWindow {
		p.errs.add(p.file, l.earlyLine, "early_warning applies to fixed_window and sliding_window only (algorithm is %s)", AlgorithmName(l.algorithm))
	}
	if float64(l.unit.Duration())*float64(l.mult) > float64(MaxWindow) {
		p.errs.add(p.file, at(l.multLine), "window %s × %d is longer than the maximum of %d days", unit, l.mult, MaxWindow/(24*time.Hour))
	}
	if len(p.errs.errs) > before {
		return
	}
	if err := compileLimit(l).Validate(); err != nil {
		msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), algo.ErrInvalidLimit.Error()), ": ")
		p.errs.add(p.file, l.line, "rate limit out of bounds: %s", msg)
	}
}

// compileLimit is the algo.Limit of a validated rawLimit with a valid unit.
func compileLimit(l *rawLimit) algo.Limit {
	lim := algo.Limit{
		Kind:       l.algorithm,
		Rate:       l.rpu,
		Period:     l.unit.Duration() * time.Duration(l.mult),
		Burst:      l.burst,
		Multiplier: l.mult,
	}
	if l.calendar {
		lim.Calendar = algo.CalendarMonth
		if l.unit == Year {
			lim.Calendar = algo.CalendarYear
		}
	}
	return lim
}

// DefaultEarlyWarning is the early warning of a fixed or sliding window
// without early_warning: more than half of the limit used within the
// first fifth of the window.
var DefaultEarlyWarning = EarlyWarning{Used: 0.5, Within: 0.2}

// earlyWarning parses early_warning: false (off), true (the defaults) or
// a mapping {used: <share>, within: <share>}, shares in (0, 1].
func (p *parser) earlyWarning(v *yaml.Node) EarlyWarning {
	if v.Kind == yaml.ScalarNode {
		if p.boolean(v, "early_warning") {
			return DefaultEarlyWarning
		}
		return EarlyWarning{}
	}
	ew := DefaultEarlyWarning
	if v.Kind != yaml.MappingNode {
		p.errs.add(p.file, v.Line, "early_warning must be true, false or a mapping {used, within}, got %s", kindName(v))
		return ew
	}
	p.mapping(v, func(k string, kn, v *yaml.Node) {
		switch k {
		case "used":
			ew.Used = p.share(v, "early_warning.used")
		case "within":
			ew.Within = p.share(v, "early_warning.within")
		default:
			p.unknown(kn, k, "early_warning", nil, []string{"used", "within"})
		}
	})
	return ew
}

// share decodes a number in (0, 1].
func (p *parser) share(v *yaml.Node, field string) float64 {
	var f float64
	if v.Kind != yaml.ScalarNode || (v.Tag != "!!float" && v.Tag != "!!int") || v.Decode(&f) != nil || !(f > 0 && f <= 1) {
		p.errs.add(p.file, v.Line, "%s must be a number above 0 and at most 1, got %q", field, v.Value)
		return 0
	}
	return f
}
