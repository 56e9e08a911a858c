// Package tlsreload serves a listener's TLS certificate, key and client CA
// from files and picks up replaced files without a restart.
package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Reloader serves a server's TLS material from files and picks up
// replaced files without a restart: at most once per checkEvery, a
// handshake stats the files and reloads them when one changed. A file's
// stamp (resolved path, device, inode, size, modification time) sees both
// a file renamed over the old one and a Kubernetes mount's ..data symlink
// swap. A failed reload keeps the previous material, is logged, and is
// retried at the next check. Safe for concurrent use.
//
// It checks on the handshake rather than with fsnotify: inotify watches
// are lost when a watched directory is replaced and miss network and FUSE
// file systems, while a handshake is the only moment the material is read.
type Reloader struct {
	certFile, keyFile, caFile, san string
	// http: the config is the HTTP listener's (--http-tls): HTTP/2 and
	// HTTP/1.1, client certificates verified when given but not required,
	// no SAN check at the handshake (the /json boundary checks it).
	http       bool
	log        *slog.Logger
	checkEvery time.Duration
	now        func() time.Time // the clock of checkEvery (time.Now)

	mu      sync.Mutex
	checked time.Time
	stamp   []fileStamp
	cfg     *tls.Config
}

// New loads the certificate and key (and the client CA, when caFile is
// set) or fails naming the listener. For gRPC (forHTTP false) a client CA
// makes client certificates required, and san, when set, must be among a
// client certificate's SANs; for HTTP (forHTTP true) they are verified when
// given but not required, and ALPN offers HTTP/1.1 besides HTTP/2.
func New(certFile, keyFile, caFile, san string, forHTTP bool, log *slog.Logger) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, caFile: caFile, san: san, http: forHTTP, log: log, checkEvery: time.Second, now: time.Now}
	st, err := r.fileStamps()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.name(), err)
	}
	cfg, err := r.load()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.name(), err)
	}
	r.cfg, r.stamp, r.checked = cfg, st, r.now()
	return r, nil
}

// name prefixes the reloader's errors and log lines.
func (r *Reloader) name() string {
	if r.http {
		return "http tls"
	}
	return "grpc tls"
}

// Config is the tls.Config to hand to the server: every handshake
// asks GetConfigForClient for the current material.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.current(), nil },
	}
}

func (r *Reloader) current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.checked) < r.checkEvery {
		return r.cfg
	}
	r.checked = now
	st, err := r.fileStamps()
	if err != nil || sameStamps(st, r.stamp) {
		return r.cfg
	}
	cfg, err := r.load()
	if err != nil {
		r.log.Error(r.name()+": reload failed; keeping the previous certificate", "err", err)
		return r.cfg
	}
	r.cfg, r.stamp = cfg, st
	r.log.Info(r.name() + ": certificates reloaded")
	return r.cfg
}

// fileStamp is what tells a replaced file (see Reloader): the path its
// symlinks resolve to and the file found there.
type fileStamp struct {
	real string
	fi   os.FileInfo
}

// sameStamps reports whether a and b name the same files, unchanged: the
// same resolved paths, the same files there (os.SameFile: device and
// inode on Unix) with the same size and modification time.
func sameStamps(a, b []fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.real != y.real || !os.SameFile(x.fi, y.fi) || x.fi.Size() != y.fi.Size() || !x.fi.ModTime().Equal(y.fi.ModTime()) {
			return false
		}
	}
	return true
}

// fileStamps are the stamps of the configured files (certificate, key,
// client CA when set), or the error of the first one that cannot be
// resolved or stat'ed.
func (r *Reloader) fileStamps() ([]fileStamp, error) {
	var s []fileStamp
	for _, f := range []string{r.certFile, r.keyFile, r.caFile} {
		if f == "" {
			continue
		}
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(real)
		if err != nil {
			return nil, err
		}
		s = append(s, fileStamp{real: real, fi: fi})
	}
	return s, nil
}

func (r *Reloader) load() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		NextProtos:   []string{"h2"},
	}
	if r.http {
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	if r.caFile != "" {
		pem, err := os.ReadFile(r.caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate", r.caFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if r.http {
			cfg.ClientAuth = tls.VerifyClientCertIfGiven
		}
		if r.san != "" && !r.http {
			san := r.san
			cfg.VerifyConnection = func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 || !HasSAN(cs.PeerCertificates[0], san) {
					return errors.New("grpc tls: client certificate lacks the required SAN " + san)
				}
				return nil
			}
		}
	}
	return cfg, nil
}

// HasSAN reports whether c names san among its DNS, URI, IP or e-mail SANs.
func HasSAN(c *x509.Certificate, san string) bool {
	for _, d := range c.DNSNames {
		if d == san {
			return true
		}
	}
	for _, u := range c.URIs {
		if u.String() == san {
			return true
		}
	}
	for _, ip := range c.IPAddresses {
		if ip.String() == san {
			return true
		}
	}
	for _, e := range c.EmailAddresses {
		if e == san {
			return true
		}
	}
	return false
}
