package policy

import "strings"

// pattern is a descriptor value with '*' wildcards, pre-split at load.
// Each '*' matches zero or more bytes; the segments between them must
// appear in order: the first as a prefix, the last as a suffix.
type pattern struct {
	segs []string // len >= 2: "a*b*c" -> ["a" "b" "c"]
	min  int      // total length of the segments
}

func compilePattern(v string) pattern {
	segs := strings.Split(v, "*")
	n := 0
	for _, s := range segs {
		n += len(s)
	}
	return pattern{segs: segs, min: n}
}

// prefixPattern matches the strings that begin with prefix, '*' in it
// included as text.
func prefixPattern(prefix string) pattern {
	return pattern{segs: []string{prefix, ""}, min: len(prefix)}
}

// match reports whether s matches the pattern.
func (p *pattern) match(s string) bool {
	if len(s) < p.min {
		return false
	}
	first, last := p.segs[0], p.segs[len(p.segs)-1]
	if !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	mid := s[len(first) : len(s)-len(last)]
	for _, seg := range p.segs[1 : len(p.segs)-1] {
		i := strings.Index(mid, seg)
		if i < 0 {
			return false
		}
		mid = mid[i+len(seg):]
	}
	return true
}
