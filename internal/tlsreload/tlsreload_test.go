package tlsreload

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// reloaderClock is a Reloader's clock, moved by the test.
type reloaderClock struct{ t time.Time }

func (c *reloaderClock) now() time.Time { return c.t }

// served does one TLS handshake against r's Config over a pipe and returns
// the certificate the server presented (DER).
func served(t *testing.T, r *Reloader) []byte {
	t.Helper()
	sc, cc := net.Pipe()
	defer func() { _ = sc.Close(); _ = cc.Close() }()
	srv := tls.Server(sc, r.Config())
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	cli := tls.Client(cc, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // the test reads the served certificate, it trusts nothing
	if err := cli.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	return cli.ConnectionState().PeerCertificates[0].Raw
}

// certOf is the certificate (DER) of the pair in certFile and keyFile.
func certOf(t *testing.T, certFile, keyFile string) []byte {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf.Raw
}

// newTestReloader is a gRPC reloader on cert and key with a clock the test
// moves and a log it reads.
func newTestReloader(t *testing.T, cert, key string) (*Reloader, *reloaderClock, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	r, err := New(cert, key, "", "", false, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	clk := &reloaderClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r.now, r.checked = clk.now, clk.t
	return r, clk, &logs
}

func generate(t *testing.T, dir string) *redistest.TLSFiles {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := redistest.GenerateTLS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTLSReloaderRenamedFiles: files renamed over the served ones are
// served from the first handshake one checkEvery after the last check, not
// before; a pair that does not match keeps the previous certificate, is
// logged and is tried again at the next check.
func TestTLSReloaderRenamedFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := generate(t, filepath.Join(dir, "a")), generate(t, filepath.Join(dir, "b"))
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyFile(t, a.CertFile, cert)
	copyFile(t, a.KeyFile, key)
	r, clk, logs := newTestReloader(t, cert, key)
	certA, certB := certOf(t, a.CertFile, a.KeyFile), certOf(t, b.CertFile, b.KeyFile)
	if got := served(t, r); !bytes.Equal(got, certA) {
		t.Fatal("served a certificate other than the first one (A)")
	}

	// A certificate without its key: the reload fails, A stays.
	replace := func(from, to string) {
		t.Helper()
		tmp := to + ".tmp"
		copyFile(t, from, tmp)
		if err := os.Rename(tmp, to); err != nil {
			t.Fatal(err)
		}
	}
	replace(b.CertFile, cert)
	clk.t = clk.t.Add(r.checkEvery)
	if got := served(t, r); !bytes.Equal(got, certA) {
		t.Fatalf("with a mismatched key: served a certificate other than the previous one (A)")
	}
	if !strings.Contains(logs.String(), "reload failed") {
		t.Fatalf("a failed reload was not logged: %q", logs.String())
	}

	// The key arrives: not before the next check, then B.
	replace(b.KeyFile, key)
	clk.t = clk.t.Add(r.checkEvery - time.Nanosecond)
	if got := served(t, r); !bytes.Equal(got, certA) {
		t.Fatalf("within checkEvery of the last check: served a certificate other than A")
	}
	clk.t = clk.t.Add(time.Nanosecond)
	if got := served(t, r); !bytes.Equal(got, certB) {
		t.Fatalf("after the key arrived: served a certificate other than the new one (B)")
	}
	if !strings.Contains(logs.String(), "certificates reloaded") {
		t.Fatalf("the reload was not logged: %q", logs.String())
	}
}

// TestTLSReloaderSecretSymlinkSwap: a Kubernetes Secret volume's tls.crt
// and tls.key are symlinks to ..data/tls.crt and ..data/tls.key, and
// ..data a symlink to a timestamped directory; an update writes a new
// directory and renames a new ..data symlink over the old one. The new
// pair is served even when its files have the old files' modification
// time, and the removed old directory is never read again.
func TestTLSReloaderSecretSymlinkSwap(t *testing.T) {
	vol := t.TempDir()
	a := generate(t, filepath.Join(vol, "..2026_01_01_00_00_00.1"))
	for _, name := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	swap := func(dir string) {
		t.Helper()
		tmp := filepath.Join(vol, "..data_tmp")
		if err := os.Symlink(filepath.Base(dir), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(vol, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	// The volume's files are server.crt/server.key in the generated
	// directory: link them under the names the Secret uses.
	// Each is padded with newlines (PEM ignores them) to 4 KiB, so that
	// the two generations also have the same sizes.
	link := func(dir string) {
		t.Helper()
		for from, to := range map[string]string{"server.crt": "tls.crt", "server.key": "tls.key"} {
			b, err := os.ReadFile(filepath.Join(dir, from))
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, bytes.Repeat([]byte("\n"), 4096-len(b))...)
			if err := os.WriteFile(filepath.Join(dir, to), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	link(filepath.Dir(a.CertFile))
	swap(filepath.Dir(a.CertFile))
	cert, key := filepath.Join(vol, "tls.crt"), filepath.Join(vol, "tls.key")
	r, clk, _ := newTestReloader(t, cert, key)
	certA := certOf(t, cert, key)
	if got := served(t, r); !bytes.Equal(got, certA) {
		t.Fatalf("served a certificate other than A")
	}

	b := generate(t, filepath.Join(vol, "..2026_01_01_00_01_00.2"))
	bdir := filepath.Dir(b.CertFile)
	link(bdir)
	// The modification times of the files they replace: with the sizes
	// equal, only the resolved path and the inode tell them apart.
	for _, name := range []string{"tls.crt", "tls.key"} {
		old, err := os.Stat(filepath.Join(filepath.Dir(a.CertFile), name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(bdir, name), old.ModTime(), old.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	swap(bdir)
	if err := os.RemoveAll(filepath.Dir(a.CertFile)); err != nil {
		t.Fatal(err)
	}
	certB := certOf(t, cert, key)
	if bytes.Equal(certB, certA) {
		t.Fatal("the two generated certificates are the same")
	}
	clk.t = clk.t.Add(r.checkEvery)
	if got := served(t, r); !bytes.Equal(got, certB) {
		t.Fatalf("after the ..data swap: served a certificate other than the new one (B)")
	}
}

// TestTLSReloaderMissingFiles: a file that cannot be read at start is an
// error naming the listener; one that vanishes later keeps the served
// certificate.
func TestTLSReloaderMissingFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(filepath.Join(dir, "none.crt"), filepath.Join(dir, "none.key"), "", "", true, slog.Default()); err == nil || !strings.HasPrefix(err.Error(), "http tls: ") {
		t.Fatalf("missing files: %v, want an error prefixed http tls", err)
	}
	a := generate(t, dir)
	r, clk, _ := newTestReloader(t, a.CertFile, a.KeyFile)
	certA := certOf(t, a.CertFile, a.KeyFile)
	if err := os.Remove(a.KeyFile); err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(r.checkEvery)
	if got := served(t, r); !bytes.Equal(got, certA) {
		t.Fatalf("with the key gone: served a certificate other than A")
	}
}
