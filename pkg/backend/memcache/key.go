// The memcached key and expiration of a (hit key, window) counter.

package memcache

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"time"
)

// maxRelativeExpiry is memcached's bound on a relative expiration time in
// seconds: a larger exptime is read as an absolute Unix time (memcached
// protocol.txt, "Expiration times").
const maxRelativeExpiry = 60 * 60 * 24 * 30

// expiryGrace is added to a counter's expiration: memcached's clock ticks
// in whole seconds, so a relative expiration may end up to one second
// early; the window's key changes at the window's end anyway, so a
// counter living a little longer costs memory only.
const expiryGrace = 2

// CounterKey is the memcached key of hit key k in the window starting at
// startUs (µs since the epoch): k + "_" + startUs, or, when that is not a
// legal memcached key (longer than 250 bytes, or holding spaces or control
// characters, as clear-text keys may), "rlmc1_" followed by the unpadded
// base64url of the first 128 bits of its SHA-256.
func CounterKey(k string, startUs int64) string {
	key := k + "_" + strconv.FormatInt(startUs, 10)
	if legalKey(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "rlmc1_" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// legalKey is memcached's key rule (gomemcache checks the same).
func legalKey(k string) bool {
	if len(k) > 250 || k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] == 0x7f {
			return false
		}
	}
	return true
}

// pinnedSlack is added to a counter's expiration (seconds) when
// Options.Now pins the clock (tests): memcached expires counters by real
// time, which a pinned clock does not follow, so a counter must outlast
// any real time a test spends at one pinned instant, however starved the
// host. The expiration is the only real time a pinned Store uses, and
// with the slack it changes no answer.
const pinnedSlack = 3600

// expiration is the memcached exptime of a counter whose window ends at
// endUs, seen at nowUs: the seconds left (rounded up) plus expiryGrace
// and slack, as an absolute Unix time (from the real clock) beyond
// memcached's 30-day bound on relative times.
func expiration(nowUs, endUs, slack int64) int32 {
	secs := (endUs-nowUs+999_999)/1_000_000 + expiryGrace + slack
	if secs <= maxRelativeExpiry {
		return int32(secs)
	}
	return int32(min(time.Now().Unix()+secs, int64(1<<31-1)))
}
