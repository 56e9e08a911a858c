package compat

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// redisSets maps REDIS_TYPE, REDIS_URL, REDIS_SOCKET_TYPE, REDIS_AUTH and
// REDIS_TLS onto --redis-mode, --redis-url, --redis-addrs and
// --redis-master. The reference's REDIS_URL is not a URL: single mode
// takes host:port or a unix socket path, cluster mode "h:p,h:p", sentinel
// mode "master,h:p,h:p". A value that already is a redis:// or rediss://
// URL is taken as is; with REDIS_URL unset it is the reference's
// default, its nutcracker socket.
func redisSets(typ, raw string, urlSet bool, lookup func(string) (string, bool)) ([]Set, error) {
	get := func(name string) string { v, _ := lookup(name); return strings.TrimSpace(v) }
	auth := get("REDIS_AUTH")
	useTLS := false
	if v := get("REDIS_TLS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("REDIS_TLS=%q: %w", v, err)
		}
		useTLS = b
	}
	userInfo := func(u *url.URL) {
		if auth == "" {
			return
		}
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			u.User = url.UserPassword(user, pass)
		} else {
			u.User = url.UserPassword("", auth)
		}
	}
	scheme := "redis"
	if useTLS {
		scheme = "rediss"
	}
	build := func(host string) string {
		u := url.URL{Scheme: scheme, Host: host}
		userInfo(&u)
		return u.String()
	}
	if !urlSet {
		raw = "/var/run/nutcracker/ratelimit.sock"
	}
	switch strings.ToLower(typ) {
	case "", "single":
		mode := Set{"redis-mode", "standalone"}
		switch {
		case strings.Contains(raw, "://"):
			return []Set{mode, {"redis-url", raw}}, nil
		case strings.HasPrefix(raw, "/") || (get("REDIS_SOCKET_TYPE") != "tcp" && !strings.Contains(raw, ":")):
			u := url.URL{Scheme: "unix", Path: raw}
			userInfo(&u)
			return []Set{mode, {"redis-url", u.String()}}, nil
		case strings.ContainsAny(raw, "@/?#%"):
			// host:port has none of these; a value with user info (a
			// password) or a path is named, never quoted.
			return []Set{mode}, errors.New("REDIS_URL must be host:port, a unix socket path or a redis:// URL; credentials go in REDIS_AUTH (its value is not shown: it may hold a credential)")
		default:
			return []Set{mode, {"redis-url", build(raw)}}, nil
		}
	case "cluster":
		addrs := splitList(raw)
		if len(addrs) == 0 {
			return []Set{{"redis-mode", "cluster"}}, errors.New("REDIS_TYPE=cluster: REDIS_URL must list nodes as host:port,host:port")
		}
		return []Set{{"redis-mode", "cluster"}, {"redis-addrs", strings.Join(addrs, ",")}, {"redis-url", build(addrs[0])}}, nil
	case "sentinel":
		parts := splitList(raw)
		if len(parts) < 2 {
			return nil, errors.New("REDIS_TYPE=sentinel: REDIS_URL must be master,host:port[,host:port...] (its value is not shown: it may hold a credential)")
		}
		return []Set{{"redis-mode", "sentinel"}, {"redis-master", parts[0]}, {"redis-addrs", strings.Join(parts[1:], ",")}, {"redis-url", build(parts[1])}}, nil
	default:
		return nil, fmt.Errorf("REDIS_TYPE=%q: want single, cluster or sentinel", typ)
	}
}

// splitList splits a comma-separated list, trimming and dropping empty
// items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Secrets returns the credentials the reference's variables may hold
// (REDIS_AUTH, REDIS_SENTINEL_AUTH, the password of a REDIS_URL with
// user info), so that no error quotes them back. urlPassword returns a
// URL's password ("" for none).
func Secrets(lookup func(string) (string, bool), urlPassword func(string) string) []string {
	var secrets []string
	for _, name := range []string{"REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_URL"} {
		if v, ok := lookup(name); ok {
			v = strings.TrimSpace(v)
			secrets = append(secrets, urlPassword(v))
			if name != "REDIS_URL" {
				secrets = append(secrets, v)
				if _, p, ok := strings.Cut(v, ":"); ok {
					secrets = append(secrets, p)
				}
			}
		}
	}
	return secrets
}
