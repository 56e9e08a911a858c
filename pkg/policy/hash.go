package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
)

// Hash returns the hex SHA-256 of the canonical compiled content (domains,
// rule paths, limits, flags, metadata; not file names or lines), for a
// config-version metric. Equal configs give equal hashes.
func (s *Set) Hash() string {
	if s == nil {
		return ""
	}
	return s.hash
}

// SourceHash returns the hex SHA-256 of what Load read: the LoadOptions,
// then every file's path and bytes, length-prefixed, in load order. Any
// byte change, added, removed or renamed file changes it, so a reload with
// an equal SourceHash is a no-op. It is "" for a nil Set or one not built
// by Load.
func (s *Set) SourceHash() string {
	if s == nil {
		return ""
	}
	return s.sourceHash
}

func (s *Set) computeHash() {
	h := sha256.New()
	for _, d := range s.names {
		fmt.Fprintf(h, "domain %q\n", d)
		hashOverride(h, s.domains[d].override)
		for _, r := range s.rules {
			if r.Domain != d {
				continue
			}
			fmt.Fprintf(h, "rule")
			for _, n := range r.nodes {
				fmt.Fprintf(h, " %q/%d/%q/%t/%t", n.key, n.kind, n.value, n.share, n.valueToMetric)
			}
			fmt.Fprintf(h, " unlimited=%t shadow=%t quota=%t detailed=%t name=%q replaces=%q\n", r.Unlimited, r.ShadowMode, r.QuotaMode, r.DetailedMetric, r.Name, r.Replaces)
			if r.Counting != CountingDefault { // absent from older hashes: they stay the same
				fmt.Fprintf(h, " counting=%s\n", r.Counting)
			}
			for i, n := range r.nodes { // absent when unset: older hashes stay the same
				if n.ipv6Prefix > 0 {
					fmt.Fprintf(h, " ipv6_prefix[%d]=%d\n", i, n.ipv6Prefix)
				}
			}
			if c := r.CGNAT; c != nil {
				fmt.Fprintf(h, " cgnat=%d %v\n", c.Multiplier, c.Ranges)
			}
			if rs := r.Reserve; rs != nil {
				fmt.Fprintf(h, " reserve=%q %q %g %g\n", rs.Entry, rs.Value, rs.Share, rs.SaturatedShare)
			}
			for _, l := range r.Limits {
				fmt.Fprintf(h, " limit %q %q %d %d %d %d %d %t %d %g %g\n", l.Name, l.Policy, l.Unit, l.RequestsPerUnit, l.UnitMultiplier, l.Algorithm, l.Burst, l.Calendar, l.FailureMode, l.EarlyWarning.Used, l.EarlyWarning.Within)
			}
			if len(r.nodes) > 0 {
				hashOverride(h, r.nodes[len(r.nodes)-1].override)
			}
			if r.Metadata != nil {
				j, _ := json.Marshal(r.Metadata) // map keys sorted
				fmt.Fprintf(h, " metadata %s\n", j)
			}
		}
	}
	s.hash = hex.EncodeToString(h.Sum(nil))
}

func hashOverride(w io.Writer, op *overridePolicy) {
	if op == nil {
		return
	}
	fmt.Fprintf(w, " override %t/%d %t/%d/%d %t/%d\n", op.modeSet, op.mode, op.maxSet, op.maxRPU, op.maxUnit, op.failSet, op.failure)
}
