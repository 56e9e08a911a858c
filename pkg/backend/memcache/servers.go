// The server list: Options.Addrs resolved once, or Options.SRV refreshed.

package memcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"
)

// resolveLoop resolves the servers again until it succeeded once (every
// unhealthyProbeInterval), then every Options.SRVRefresh (SRV only; 0:
// never).
func (s *Store) resolveLoop() {
	defer s.wg.Done()
	for {
		d := time.Duration(0)
		if s.opts.SRV != "" {
			d = s.opts.SRVRefresh
		}
		if !s.resolved.Load() && (d == 0 || d > unhealthyProbeInterval) {
			d = unhealthyProbeInterval
		}
		if d == 0 {
			return // resolved, no refresh
		}
		if !s.wait(d) {
			return
		}
		_ = s.resolve()
	}
}

// resolve installs the servers: Options.Addrs (their host names resolved
// now; a name that does not resolve yet is retried), or the targets of
// Options.SRV.
func (s *Store) resolve() error {
	if s.opts.SRV != "" {
		return s.refreshSRV()
	}
	if err := s.servers.SetServers(s.opts.Addrs...); err != nil {
		return fmt.Errorf("memcache: servers %s: %w", strings.Join(s.opts.Addrs, ","), err)
	}
	s.nservers.Store(int32(len(s.opts.Addrs)))
	s.resolved.Store(true)
	return nil
}

// refreshSRV resolves Options.SRV and installs its targets, sorted. A
// failed lookup (or one without targets) keeps the current list.
func (s *Store) refreshSRV() error {
	service, proto, name, err := parseSRV(s.opts.SRV)
	if err != nil {
		return err
	}
	lookup := s.opts.LookupSRV
	if lookup == nil {
		lookup = net.DefaultResolver.LookupSRV
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(s.timeout, time.Second))
	defer cancel()
	_, recs, err := lookup(ctx, service, proto, name)
	if err != nil {
		return fmt.Errorf("memcache: SRV lookup: %w", err)
	}
	addrs := ServersFromSRV(recs)
	if len(addrs) == 0 {
		return errors.New("memcache: SRV lookup: no targets")
	}
	if err := s.servers.SetServers(addrs...); err != nil {
		return fmt.Errorf("memcache: SRV targets: %w", err)
	}
	s.nservers.Store(int32(len(addrs)))
	s.resolved.Store(true)
	return nil
}

// ServersFromSRV turns SRV records into "host:port" strings (the target's
// trailing dot removed), sorted, so that every replica lists the servers
// in the same order and so selects the same server for a key.
func ServersFromSRV(recs []*net.SRV) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		if r == nil || r.Target == "" {
			continue
		}
		out = append(out, net.JoinHostPort(strings.TrimSuffix(r.Target, "."), strconv.Itoa(int(r.Port))))
	}
	sort.Strings(out)
	return out
}

// Servers returns the current server list as "host:port" strings, in
// selection order.
func (s *Store) Servers() []string {
	var out []string
	_ = s.servers.Each(func(a net.Addr) error {
		out = append(out, a.String())
		return nil
	})
	return out
}
