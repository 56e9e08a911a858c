package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// tlsReloader serves the gRPC server's TLS material from files and picks up
// replaced files without a restart: at most once per checkEvery, a handshake
// stats the files and reloads them when their size or modification time
// changed (cert-manager and Kubernetes Secret mounts replace files
// atomically). A reload that fails keeps the previous material and is
// logged. Safe for concurrent use.
type tlsReloader struct {
	certFile, keyFile, caFile, san string
	// http: the config is the HTTP listener's (--http-tls): HTTP/2 and
	// HTTP/1.1, client certificates verified when given but not required,
	// no SAN check at the handshake (jsonBoundary.guard checks /json).
	http       bool
	log        *slog.Logger
	checkEvery time.Duration

	mu      sync.Mutex
	checked time.Time
	stamp   string
	cfg     *tls.Config
}

func newTLSReloader(certFile, keyFile, caFile, san string, forHTTP bool, log *slog.Logger) (*tlsReloader, error) {
	r := &tlsReloader{certFile: certFile, keyFile: keyFile, caFile: caFile, san: san, http: forHTTP, log: log, checkEvery: time.Second}
	st, err := r.fileStamp()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.name(), err)
	}
	cfg, err := r.load()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.name(), err)
	}
	r.cfg, r.stamp, r.checked = cfg, st, time.Now()
	return r, nil
}

// name prefixes the reloader's errors and log lines.
func (r *tlsReloader) name() string {
	if r.http {
		return "http tls"
	}
	return "grpc tls"
}

// Config is the tls.Config to hand to the gRPC server: every handshake
// asks GetConfigForClient for the current material.
func (r *tlsReloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.current(), nil },
	}
}

func (r *tlsReloader) current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) < r.checkEvery {
		return r.cfg
	}
	r.checked = time.Now()
	st, err := r.fileStamp()
	if err != nil || st == r.stamp {
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

func (r *tlsReloader) fileStamp() (string, error) {
	s := ""
	for _, f := range []string{r.certFile, r.keyFile, r.caFile} {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%s:%d:%d;", f, fi.Size(), fi.ModTime().UnixNano())
	}
	return s, nil
}

func (r *tlsReloader) load() (*tls.Config, error) {
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
				if len(cs.PeerCertificates) == 0 || !hasSAN(cs.PeerCertificates[0], san) {
					return errors.New("grpc tls: client certificate lacks the required SAN " + san)
				}
				return nil
			}
		}
	}
	return cfg, nil
}

// hasSAN reports whether c names san among its DNS, URI, IP or e-mail SANs.
func hasSAN(c *x509.Certificate, san string) bool {
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
