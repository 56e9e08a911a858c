package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

const (
	websiteConfig = "../../examples/website"
	websiteEnvoy  = "../../envoy/website.yaml"
	websiteLog    = "../../examples/website/testdata/semicomplete-2015.log"
)

// TestReplayUsage: `ratelimitd replay` prints its usage for -h, exits 2 with
// the offending flag named for a missing or bad flag, and 1 with the cause
// when the config, Envoy file or log cannot be used.
func TestReplayUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"help", []string{"-h"}, 0, "Usage: ratelimitd replay"},
		{"nothing", nil, 2, "--config is required"},
		{"bad output", []string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", websiteLog, "--output", "pdf"}, 2, "output"},
		{"bad format", []string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", websiteLog, "--format", "json"}, 2, "only combined"},
		{"bad counting", []string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", websiteLog, "--counting", "always"}, 2, `--counting="always"`},
		{"negative speed", []string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", websiteLog, "--speed", "-1"}, 2, "--speed"},
		{"domain not in config", []string{"--config", websiteConfig, "--envoy", "../../envoy/edge.yaml", "--log", websiteLog}, 1, `domain "example" is not in the config`},
		{"missing log", []string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", "nosuch.log"}, 1, "nosuch.log"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(t.Context(), append([]string{"replay"}, tc.args...), func(string) (string, bool) { return "", false }, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			if !strings.Contains(errb.String()+out.String(), tc.msg) {
				t.Errorf("output lacks %q:\n%s%s", tc.msg, out.String(), errb.String())
			}
		})
	}
}

// TestReplayOutputs: the replay of the website example writes a JSON
// report to --out and a self-contained HTML page to standard output.
func TestReplayOutputs(t *testing.T) {
	dir := t.TempDir()
	jsonOut := filepath.Join(dir, "report.json")
	var out, errb bytes.Buffer
	base := []string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", websiteLog}
	if code := replayMain(append(base, "--output", "json", "--out", jsonOut), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	data, err := os.ReadFile(jsonOut)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Requests, Denied int
		Rules            []struct{ Allowed, Denied, Shadow int }
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 10000 || len(rep.Rules) == 0 || rep.Denied == 0 {
		t.Errorf("report: %+v", rep)
	}
	out.Reset()
	if code := replayMain(append(base, "--output", "html", "--order", "file"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if page := out.String(); !strings.HasPrefix(page, "<!DOCTYPE html>") || !strings.Contains(page, "<svg") {
		t.Errorf("html output: %.200s", page)
	}
	out.Reset()
	if code := replayMain(append(base, "--shadow-mode"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if text := out.String(); !strings.Contains(text, "denied (429):              0") || !strings.Contains(text, "shadow mode: true") {
		t.Errorf("text output with --shadow-mode:\n%s", text)
	}
}

// TestReplayRedisBackend runs the CLI with --backend redis on a real
// redis-server: the simulated clock must reach the Lua script (redis.Options.Now)
// and the report must equal the memory backend's.
func TestReplayRedisBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	srv := redistest.Standalone(t)
	base := []string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", websiteLog, "--output", "json"}
	var mem, rds, errb bytes.Buffer
	if code := replayMain(base, &mem, &errb); code != 0 {
		t.Fatalf("memory: exit %d: %s", code, errb.String())
	}
	if code := replayMain(append(base, "--backend", "redis", "--redis-url", srv.URL()), &rds, &errb); code != 0 {
		t.Fatalf("redis: exit %d: %s", code, errb.String())
	}
	if !bytes.Equal(mem.Bytes(), rds.Bytes()) {
		t.Errorf("redis report differs from memory report:\n%.1500s\n---\n%.1500s", mem.String(), rds.String())
	}
}

// TestReplayAllMalformed: a log of which no line parses is almost always
// the wrong format: the report (listing the malformed lines) is still
// written, the exit code is 1.
func TestReplayAllMalformed(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "garbage.log")
	if err := os.WriteFile(log, []byte("not a log line\n{\"json\": true}\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := replayMain([]string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", log}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "none of the 2 lines") {
		t.Errorf("exit %d, stderr %q; want 1 and a message naming the 2 lines", code, errb.String())
	}
	if !strings.Contains(out.String(), "2 malformed") {
		t.Errorf("report not written:\n%s", out.String())
	}
}

// TestReplaySuggest: --suggest adds the suggestion to the text report (with
// the config fragment) and to the JSON report.
func TestReplaySuggest(t *testing.T) {
	base := []string{"--config", websiteConfig, "--envoy", websiteEnvoy, "--log", websiteLog, "--suggest"}
	var out, errb bytes.Buffer
	if code := replayMain(base, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"suggested limits:", "rule website.remote_address (per-ip: 60/minute token_bucket burst 120; window 1m0s)",
		"# ../../examples/website/config.yaml with the suggested limits, every rule in shadow mode:", "shadow_mode: true"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q", want)
		}
	}
	out.Reset()
	if code := replayMain(append(base, "--output", "json"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Suggestion struct {
			Classes []struct {
				Rule       string                  `json:"rule"`
				Suggested  int                     `json:"suggested"`
				Candidates []struct{ Name string } `json:"candidates"`
			} `json:"classes"`
			Fragments []struct{ YAML string } `json:"fragments"`
		} `json:"suggestion"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Suggestion.Classes) == 0 || len(rep.Suggestion.Fragments) != 1 {
		t.Fatalf("json suggestion %+v", rep.Suggestion)
	}
	for _, c := range rep.Suggestion.Classes {
		if c.Suggested > 0 && len(c.Candidates) != 6 {
			t.Errorf("%s: %d candidates, want 6", c.Rule, len(c.Candidates))
		}
	}
	out.Reset()
	if code := replayMain(append(base, "--output", "html"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"<h2>Suggested limits</h2>", "<h3>website.remote_address</h3>", "<td>suggested</td><td>83 burst 17</td>", "shadow_mode: true"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("html output lacks %q", want)
		}
	}
}
