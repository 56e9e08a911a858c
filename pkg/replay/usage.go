package replay

import (
	"fmt"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// usage records, per rule and per key (the descriptor's entries), every
// request that reached the rule during a replay: its window, its second and
// whether the store denied one of the rule's hits for it (shadow rules
// included). Replay --suggest derives the distributions from it.
type usage struct {
	classes map[string]*classUsage
	order   []string
}

// classUsage is one rule's usage: its key class.
type classUsage struct {
	domain string
	rule   *policy.Rule
	limit  int   // index of the limit in rule.Limits (0 when unlimited)
	window int64 // seconds
	keys   map[string]*keyUsage
	// toWrite: the rule has no counted limit yet (unlimited); its keys
	// also record their hourly and daily usage.
	toWrite bool
}

// keyUsage is one key's usage of a rule.
type keyUsage struct {
	requests  int
	denied    int
	deniedWin map[int64]bool
	perWin    map[int64]int64
	perSec    map[int64]int64
	perHour   map[int64]int64 // toWrite classes only
	perDay    map[int64]int64 // toWrite classes only
}

func newUsage() *usage { return &usage{classes: map[string]*classUsage{}} }

// classID names a class: one limit of a rule (rate_limits holds several,
// each with its own window and suggestion).
func classID(domain, path string, limit int) string {
	return domain + "\x00" + path + "\x00" + fmt.Sprintf("%03d", limit)
}

// windowOf is the window of the rule's limit k in seconds (at least 1).
func windowOf(r *policy.Rule, k int) int64 {
	if k >= len(r.Limits) {
		return 60
	}
	w := int64(r.Limits[k].Window / time.Second)
	if w < 1 {
		w = 1
	}
	return w
}

// keyOf renders a descriptor's entries as the key of its class
// ("remote_address=192.0.2.1").
func keyOf(es []policy.Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('=')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// add records the request of descriptor d to every limit of rule r (its
// only class when r is unlimited); denied(k) reports whether the store
// denied limit k's hit.
func (u *usage) add(domain string, r *policy.Rule, d Descriptor, now time.Time, denied func(k int) bool) {
	if r.Unlimited || len(r.Limits) == 0 {
		u.addLimit(domain, r, 0, d, now, false)
		return
	}
	for k := range r.Limits {
		u.addLimit(domain, r, k, d, now, denied(k))
	}
}

func (u *usage) addLimit(domain string, r *policy.Rule, limit int, d Descriptor, now time.Time, denied bool) {
	id := classID(domain, r.Path, limit)
	c := u.classes[id]
	if c == nil {
		c = &classUsage{domain: domain, rule: r, limit: limit, window: windowOf(r, limit), keys: map[string]*keyUsage{}, toWrite: r.Unlimited}
		u.classes[id] = c
		u.order = append(u.order, id)
	}
	k := keyOf(d.Entries)
	ku := c.keys[k]
	if ku == nil {
		ku = &keyUsage{deniedWin: map[int64]bool{}, perWin: map[int64]int64{}, perSec: map[int64]int64{}}
		if c.toWrite {
			ku.perHour, ku.perDay = map[int64]int64{}, map[int64]int64{}
		}
		c.keys[k] = ku
	}
	cost := int64(d.HitsAddend)
	if cost == 0 {
		cost = 1
	}
	sec := now.Unix()
	win := floorDiv(sec, c.window)
	ku.requests++
	ku.perWin[win] += cost
	ku.perSec[sec] += cost
	if c.toWrite {
		ku.perHour[floorDiv(sec, 3600)] += cost
		ku.perDay[floorDiv(sec, 86400)] += cost
	}
	if denied {
		ku.denied++
		ku.deniedWin[win] = true
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func (k *keyUsage) peak() int64       { return maxOf(k.perWin) }
func (k *keyUsage) peakSecond() int64 { return maxOf(k.perSec) }

func maxOf(m map[int64]int64) int64 {
	var v int64
	for _, n := range m {
		v = max(v, n)
	}
	return v
}
