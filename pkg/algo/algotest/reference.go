package algotest

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Reference decides one request (hits, in order) at now the way the Store
// contract says, with pkg/algo alone, and updates states (key → state; a
// missing key is the zero State) in place: each hit is applied to the
// tentative state its key has so far in the request (algo.Apply); when a
// hit that is not Soft is denied (a check-only hit too), nothing is kept
// and the hits that did not deny report a check (algo.Take with cost 0)
// on the state before the request; otherwise every tentative state is
// kept. The returned slice has one decision per hit.
//
// It is the reference the stores' property tests compare against (the
// Redis script, batched segments, the previous script version).
func Reference(states map[string]algo.State, hits []algo.Hit, now time.Time) []algo.Decision {
	tent := make(map[string]algo.State, len(hits))
	out := make([]algo.Decision, len(hits))
	denied := false
	for i, h := range hits {
		st, ok := tent[h.Key]
		if !ok {
			st = states[h.Key]
		}
		ns, d := algo.Apply(st, h, now)
		tent[h.Key] = ns
		out[i] = d
		denied = denied || !d.Allowed && !h.Soft
	}
	if !denied {
		for k, s := range tent {
			states[k] = s
		}
		return out
	}
	for i, h := range hits {
		if out[i].Allowed {
			_, out[i] = algo.Take(h.Limit, states[h.Key], now, 0)
		}
	}
	return out
}
