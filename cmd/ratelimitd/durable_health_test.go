package main

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/health"

	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres"
	"github.com/ratelimitd/ratelimitd/pkg/backend/postgres/pgtest"
)

// TestDurableHealthLogNamesCause: the durable store's unhealthy line,
// and its healthy-again line, name the cause and the error of the outage
// (PostgreSQL killed: refused), and neither holds the password.
func TestDurableHealthLogNamesCause(t *testing.T) {
	pg := pgtest.Start(t)
	db := pg.CreateDB(t)
	o := postgres.DefaultOptions()
	o.URL, o.SweepInterval = pg.URL(db), 0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := postgres.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	logs := &testproc.Buffer{}
	s := &server{log: slog.New(slog.NewJSONHandler(logs, nil)), health: health.NewServer(), durable: st}
	s.updateDurableHealth()

	pg.Kill()
	hit := []algo.Hit{{Key: "k", Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 10, Period: time.Hour}, Cost: 1}}
	for i := 0; st.Healthy(); i++ {
		if i == 100 {
			t.Fatal("still healthy after 100 decisions with PostgreSQL killed")
		}
		_ = st.Take(context.Background(), hit, make([]algo.Decision, 1))
	}
	s.updateDurableHealth()
	pg.Restart()
	for start := time.Now(); !st.Healthy(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 20*time.Second {
			t.Fatal("not healthy 20 s after PostgreSQL was restarted")
		}
	}
	s.updateDurableHealth()

	if strings.Contains(logs.String(), pg.Password) {
		t.Errorf("the password is in the log:\n%s", logs)
	}
	lines := map[string]map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		msg, _ := rec["msg"].(string)
		lines[strings.SplitN(msg, ":", 2)[0]] = rec
	}
	for _, m := range []string{"durable store unhealthy", "durable store healthy"} {
		rec, ok := lines[m]
		if !ok {
			t.Errorf("no %q line in:\n%s", m, logs)
			continue
		}
		if rec["cause"] != postgres.CauseRefused {
			t.Errorf("%q line: cause %v, want %s", m, rec["cause"], postgres.CauseRefused)
		}
		if e, _ := rec["error"].(string); !strings.HasPrefix(e, "postgres: refused: ") {
			t.Errorf("%q line: error %q, want the store's refused error", m, e)
		}
	}
}
