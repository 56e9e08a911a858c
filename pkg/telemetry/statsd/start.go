package statsd

import "context"

// Start runs Run on its own goroutine. stop ends it: one more flush, then
// the socket is closed (Close). Call stop once.
func (c *Client) Start() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
		_ = c.Close()
	}
}
