package algo

// Calendar arithmetic in integer microseconds, UTC, proleptic Gregorian.
// The Redis script ports these functions line by line (see the package
// documentation, "Porting contract"): only integer +, -, * and floor
// division on values below 2^53 are used.

const (
	usPerSecond = int64(1_000_000)
	usPerDay    = 86_400 * usPerSecond
)

// floorDiv returns floor(a/b) for b > 0 (Go's / truncates toward zero).
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && (a < 0) {
		q--
	}
	return q
}

// daysFromCivil returns the number of days from 1970-01-01 to y-m-d
// (m in 1..12, d in 1..31), after Howard Hinnant's days_from_civil.
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(y, 400)
	yoe := y - era*400 // [0, 399]
	mp := (m + 9) % 12 // March = 0
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// civilFromDays is the inverse of daysFromCivil: it returns year and month
// (1..12) of the day z counted from 1970-01-01.
func civilFromDays(z int64) (y, m int64) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097                                  // [0, 146096]
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // [0, 399]
	y = yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	if mp < 10 {
		m = mp + 3
	} else {
		m = mp - 9
	}
	if m <= 2 {
		y++
	}
	return y, m
}

// monthStartUs returns the instant (µs since the epoch) at which month
// index mi begins, where mi counts months from January 1970 (mi = 0).
func monthStartUs(mi int64) int64 {
	y := 1970 + floorDiv(mi, 12)
	m := mi - floorDiv(mi, 12)*12 + 1
	return daysFromCivil(y, m, 1) * usPerDay
}

// WindowBoundsUs returns the window [start, end) in microseconds since the
// Unix epoch that contains nowUs, for FixedWindow and SlidingWindow
// limits: epoch-aligned windows of Period, as envoyproxy/ratelimit aligns
// its units, or with a Calendar, Multiplier UTC months or years counted
// from January 1970.
func WindowBoundsUs(l Limit, nowUs int64) (start, end int64) {
	mult := l.Multiplier
	if mult < 1 {
		mult = 1
	}
	switch l.Calendar {
	case CalendarMonth, CalendarYear:
		y, m := civilFromDays(floorDiv(nowUs, usPerDay))
		var mi int64
		if l.Calendar == CalendarMonth {
			mi = (y-1970)*12 + (m - 1)
			k := floorDiv(mi, mult) * mult
			return monthStartUs(k), monthStartUs(k + mult)
		}
		yi := y - 1970
		k := floorDiv(yi, mult) * mult
		return monthStartUs(k * 12), monthStartUs((k + mult) * 12)
	default:
		p := periodUs(l)
		start = floorDiv(nowUs, p) * p
		return start, start + p
	}
}
