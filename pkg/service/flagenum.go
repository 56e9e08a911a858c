package service

import (
	"fmt"
	"strings"
)

// flagEnum spells a uint8 enumeration of Options as its flag does
// (HeaderMode, DecisionLogMode): names[v] is the spelling of the value v,
// names[0] that of the zero value, which "" also means.
type flagEnum[M ~uint8] struct {
	typ   string   // the Go type's name, for values without a spelling
	what  string   // what the value is, for parse errors ("header mode")
	names []string // the spellings, lower case, by value
}

// String returns the spelling of m, or "<typ>(<m>)" when it has none.
func (e flagEnum[M]) String(m M) string {
	if int(m) < len(e.names) {
		return e.names[m]
	}
	return fmt.Sprintf("%s(%d)", e.typ, uint8(m))
}

// Parse returns the value spelled s (case-insensitive, surrounding space
// ignored; "" is the zero value), or an error "service: unknown <what>
// <s> (want a, b or c)".
func (e flagEnum[M]) Parse(s string) (M, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, nil
	}
	for v, n := range e.names {
		if t == n {
			return M(v), nil
		}
	}
	last := len(e.names) - 1
	return 0, fmt.Errorf("service: unknown %s %q (want %s or %s)", e.what, s, strings.Join(e.names[:last], ", "), e.names[last])
}
