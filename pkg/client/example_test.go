package client_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/client"
)

// A program calling a third-party API that publishes "100 requests per
// second, bursts of 100" paces itself 10 % under it: every request made
// through the client waits its turn instead of drawing a 429.
func Example() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("RateLimit-Policy", `"api";q=100;w=1`)
		fmt.Fprintln(w, "ok")
	}))
	defer api.Close()

	pacer := client.New(client.Options{
		Limiter: client.NewLocal(100, time.Second, 100, 0.1), // the published limit, less 10 %
	})
	httpClient := &http.Client{Transport: &client.Transport{Pacer: pacer}}

	resp, err := httpClient.Get(api.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	fmt.Println(resp.Status)
	// Output: 200 OK
}
