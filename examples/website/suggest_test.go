package website_test

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/golden"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
	"github.com/ratelimitd/ratelimitd/pkg/replay"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// memoryStores is SuggestOptions.NewStore on the memory store.
func memoryStores(now func() time.Time) (service.Store, func(), error) {
	st, err := memory.New(memory.Options{Now: now, SweepInterval: -1})
	if err != nil {
		return nil, nil, err
	}
	return st, func() { _ = st.Close() }, nil
}

func readLog(t *testing.T) []replay.LogLine {
	t.Helper()
	f, err := os.Open(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines, bad, err := replay.ParseCombined(f)
	if err != nil || len(bad) != 0 {
		t.Fatalf("parse: %v, %d malformed", err, len(bad))
	}
	return lines
}

func replayWith(t *testing.T, set *policy.Set, lines []replay.LogLine) *replay.Report {
	t.Helper()
	env, err := replay.LoadEnvoy("../../envoy/website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clock := &replay.Clock{}
	st, err := memory.New(memory.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rep, err := replay.RunLines(context.Background(), lines, nil, replay.Options{Envoy: env, Policy: set, Store: st, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestSuggestGolden pins the suggestion for the shipped log (the text docs/
// replay.md shows), and checks that replaying the printed fragment as the
// config reproduces, per rule, the printed denials of the suggested limits:
// over all keys, and over the legitimate keys alone (the log without the
// clients set aside for that rule).
func TestSuggestGolden(t *testing.T) {
	set, _, err := policy.Load(policy.LoadOptions{}, ".")
	if err != nil {
		t.Fatal(err)
	}
	env, err := replay.LoadEnvoy("../../envoy/website.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := readLog(t)
	clock := &replay.Clock{}
	st, err := memory.New(memory.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rep, err := replay.Suggest(context.Background(), lines, nil, replay.Options{Envoy: env, Policy: set, Store: st, Clock: clock}, replay.SuggestOptions{NewStore: memoryStores})
	if err != nil {
		t.Fatal(err)
	}
	check(t, rep)
	sg := rep.Suggestion
	var txt bytes.Buffer
	if err := sg.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "testdata/suggest.golden", txt.Bytes())

	if len(sg.Fragments) != 1 {
		t.Fatalf("%d fragments, want 1", len(sg.Fragments))
	}
	frag, _, err := policy.LoadSources(policy.LoadOptions{}, policy.Source{Name: sg.Fragments[0].File, Data: []byte(sg.Fragments[0].YAML)})
	if err != nil {
		t.Fatalf("the fragment does not load: %v", err)
	}
	all := replayWith(t, frag, lines)
	if all.Denied != 0 {
		t.Errorf("the fragment denied %d requests: it must be shadow only", all.Denied)
	}
	suggested := 0
	for _, c := range sg.Classes {
		if c.Refused != "" {
			continue
		}
		suggested++
		k := c.Candidates[1]
		if k.Name != "suggested" || k.Limit != c.Suggested {
			t.Fatalf("%s: candidate %+v, want the suggestion %d", c.Rule, k, c.Suggested)
		}
		if got := ruleShadow(t, all, c.Rule); got != k.Denied {
			t.Errorf("%s: printed %d denied, fragment replay %d", c.Rule, k.Denied, got)
		}
		if c.AbusiveKeys > len(c.Abusive) {
			t.Fatalf("%s: %d abusive keys, %d listed", c.Rule, c.AbusiveKeys, len(c.Abusive))
		}
		aside := map[netip.Addr]bool{}
		for _, a := range c.Abusive {
			_, ip, _ := strings.Cut(a.Key, "remote_address=")
			addr, err := netip.ParseAddr(ip)
			if err != nil {
				t.Fatalf("%s: key %q is not per client address", c.Rule, a.Key)
			}
			aside[addr] = true
		}
		var legit []replay.LogLine
		for _, l := range lines {
			if !aside[l.Client] {
				legit = append(legit, l)
			}
		}
		lr := replayWith(t, frag, legit)
		rs := ruleStats(t, lr, c.Rule)
		if rs.Shadow != k.LegitDenied || float64(rs.Shadow)/float64(rs.Allowed+rs.Shadow) != k.LegitShare {
			t.Errorf("%s: printed legit denied %d (%v), fragment replay %d of %d", c.Rule, k.LegitDenied, k.LegitShare, rs.Shadow, rs.Allowed+rs.Shadow)
		}
	}
	if suggested < 4 {
		t.Errorf("%d rules with a suggestion, want the 4 rules with enough keys", suggested)
	}
}

func ruleStats(t *testing.T, rep *replay.Report, path string) replay.RuleStats {
	t.Helper()
	for _, r := range rep.Rules {
		if r.Path == path {
			return r
		}
	}
	t.Fatalf("no rule %s in the report", path)
	return replay.RuleStats{}
}

func ruleShadow(t *testing.T, rep *replay.Report, path string) int {
	t.Helper()
	return ruleStats(t, rep, path).Shadow
}

// TestSuggestDocMatchesGolden: the sample output in docs/replay.md is a
// selection of the golden output: each run of its lines between "..." or
// blank lines (a rule's block; the command excepted) is a run of
// consecutive lines of suggest.golden.
func TestSuggestDocMatchesGolden(t *testing.T) {
	doc, err := os.ReadFile("../../docs/replay.md")
	if err != nil {
		t.Fatal(err)
	}
	gold, err := os.ReadFile("testdata/suggest.golden")
	if err != nil {
		t.Fatal(err)
	}
	const intro = "On the shipped log (`examples/website/testdata/suggest.golden`"
	i := bytes.Index(doc, []byte(intro))
	if i < 0 {
		t.Fatalf("docs/replay.md has no paragraph starting %q", intro)
	}
	rest := string(doc[i:])
	start := strings.Index(rest, "```\n")
	if start < 0 {
		t.Fatal("no code block after the sample's introduction")
	}
	rest = rest[start+4:]
	end := strings.Index(rest, "```\n")
	if end < 0 {
		t.Fatal("the sample's code block is not closed")
	}
	var runs [][]string
	var cur []string
	for _, l := range strings.Split(strings.TrimSuffix(rest[:end], "\n"), "\n") {
		switch {
		case strings.HasPrefix(l, "$ ratelimitd replay"), strings.HasPrefix(l, "    --"):
		case l == "..." || l == "":
			if len(cur) > 0 {
				runs = append(runs, cur)
			}
			cur = nil
		default:
			// The command runs from the repository's root, the golden
			// test from this directory: file names differ by the prefix.
			cur = append(cur, strings.ReplaceAll(l, "examples/website/", ""))
		}
	}
	if len(cur) > 0 {
		runs = append(runs, cur)
	}
	if n := 0; true {
		for _, r := range runs {
			n += len(r)
		}
		if n < 20 {
			t.Fatalf("the sample has %d lines of output: the check would be vacuous", n)
		}
	}
	gl := strings.Split(string(gold), "\n")
	for _, r := range runs {
		found := false
		for j := 0; j+len(r) <= len(gl) && !found; j++ {
			found = slices.Equal(gl[j:j+len(r)], r)
		}
		if !found {
			t.Errorf("docs/replay.md's sample has a block that is not in testdata/suggest.golden (copy it from the golden file):\n%s", strings.Join(r, "\n"))
		}
	}
}
