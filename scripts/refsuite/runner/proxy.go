package runner

import (
	"io"
	"net"
	"sync"
)

// proxy forwards the TCP connections of the suite's gRPC port to ratelimitd
// byte for byte (TLS included) and calls onResponse before it writes bytes
// from ratelimitd to the client, so that the stats store knows a response
// was served (a request's stats are updated before its response is sent).
type proxy struct {
	ln         net.Listener
	backend    string
	onResponse func()

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newProxy(addr, backend string, onResponse func()) (*proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, backend: backend, onResponse: onResponse, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	switch {
	case add && p.closed:
		_ = c.Close()
	case add:
		p.conns[c] = struct{}{}
	default:
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

func (p *proxy) handle(client net.Conn) {
	defer p.wg.Done()
	up, err := net.Dial("tcp", p.backend)
	if err != nil {
		_ = client.Close()
		return
	}
	p.track(client, true)
	p.track(up, true)
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, client)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(markingWriter{client, p.onResponse}, up)
		if tc, ok := client.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
	_ = client.Close()
	_ = up.Close()
	p.track(client, false)
	p.track(up, false)
}

type markingWriter struct {
	w    io.Writer
	mark func()
}

func (m markingWriter) Write(b []byte) (int, error) {
	m.mark()
	return m.w.Write(b)
}

// close stops accepting, closes every forwarded connection and waits for
// their goroutines.
func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
