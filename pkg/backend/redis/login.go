package redis

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// After the server refused a connection's setup (a wrong password, an
// unknown user, a database it does not have, an untrusted certificate),
// which only an operator fixes, the Store's client dials again only once
// per backoff: loginBackoffMin, doubling up to loginBackoffMax, reset by
// the next setup that succeeds. go-redis discards a connection whose
// setup failed, so without it every request dialed and failed a login of
// its own (a reconnect and AUTH storm that grows with traffic, fills the
// server's log and trips lockouts).
const (
	loginBackoffMin = time.Second
	loginBackoffMax = 30 * time.Second
)

// ErrLoginBackoff is the error of a call that needed a new connection
// while the Store backs off after the server refused a login (see
// loginGate): no connection was made. Classify gives it cause CauseAuth,
// as the refusal's; it is no evidence about the server, for the breaker
// or the health probe.
var ErrLoginBackoff = errors.New("not dialing: backing off after the server refused the login; fix the credentials, database or CA")

// loginGate is the dial backoff after refused logins (see
// loginBackoffMin). The Store reports refusals (refused, from every call's
// outcome) and the client's OnConnect reports a setup that succeeded
// (loggedIn); the dialer asks dial before each new connection. One gate
// serves the whole client: all its nodes take the same credentials.
type loginGate struct {
	now func() time.Time

	mu      sync.Mutex
	backoff time.Duration // 0: no refusal since the last login
	until   time.Time     // no dial before
	gen     uint64        // dials let through since the first refusal
	counted uint64        // the gen whose refusal doubled backoff
}

// dial is nil when a new connection may be dialed now, else
// ErrLoginBackoff. After a refusal one dial is let through per backoff
// (until moves on by backoff). A dial let through that did not log in
// (no loggedIn since) doubles the backoff once, at the next one, even
// when no call reported its refusal (a dial for the credit channel's
// subscription, one whose caller gave up).
func (g *loginGate) dial() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.backoff == 0 {
		return nil
	}
	now := g.now()
	if now.Before(g.until) {
		return ErrLoginBackoff
	}
	if g.counted != g.gen {
		g.backoff = min(2*g.backoff, loginBackoffMax)
		g.counted = g.gen
	}
	g.until = now.Add(g.backoff)
	g.gen++
	return nil
}

// refused records a refused login at now: the backoff starts at
// loginBackoffMin, or doubles (up to loginBackoffMax) once per dial let
// through, however many calls report the refusal of that one dial.
func (g *loginGate) refused() {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.backoff == 0:
		g.backoff = loginBackoffMin
	case g.counted != g.gen:
		g.backoff = min(2*g.backoff, loginBackoffMax)
	default:
		return
	}
	g.counted = g.gen
	g.until = g.now().Add(g.backoff)
}

// loggedIn records a connection whose setup succeeded: dials are free
// again.
func (g *loginGate) loggedIn() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.backoff, g.until = 0, time.Time{}
}

// observe is refused when err is a refused login (loginRefusal). g may be
// nil.
func (g *loginGate) observe(err error) {
	if g != nil && err != nil && loginRefusal(err) {
		g.refused()
	}
}

// onConnect is the client's OnConnect: a setup that succeeded.
func (g *loginGate) onConnect(context.Context, *goredis.Conn) error {
	g.loggedIn()
	return nil
}

// loginRefusal reports whether err is the server refusing a connection's
// setup (cause auth), which go-redis answers by discarding the
// connection: WRONGPASS, NOAUTH, a database index out of range, an
// untrusted certificate. NOPERM is not one: it refuses one command (a key
// outside the user's ACL) on a connection that stays usable. Neither is
// ErrLoginBackoff, which made no connection.
func loginRefusal(err error) bool {
	if CauseOf(err) != CauseAuth || errors.Is(err, ErrLoginBackoff) {
		return false
	}
	var re goredis.Error
	return !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "NOPERM")
}
