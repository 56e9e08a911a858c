package serveopts

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// updateFlagDocs rewrites the generated flag documentation:
//
//	go test ./internal/serveopts -run TestFlagDocs -update
var updateFlagDocs = flag.Bool("update", false, "rewrite README.md's flag table and docs/flags.md from the settings table")

// Markers around the generated flag table of README.md.
const (
	readmeBegin = "<!-- BEGIN serve flags: generated from internal/serveopts/settings.go by `go test ./internal/serveopts -run TestFlagDocs -update`; edit the table there -->\n"
	readmeEnd   = "<!-- END serve flags -->\n"
)

// flagDefaults maps each flag name to its default as the flag package
// prints it.
func flagDefaults() map[string]string {
	o := Defaults()
	fs := flag.NewFlagSet("docs", flag.ContinueOnError)
	registerServeFlags(fs, &o)
	defs := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { defs[f.Name] = f.DefValue })
	return defs
}

// shownDefault is a default in Markdown: `value`, or (none) when empty.
func shownDefault(v string) string {
	if v == "" {
		return "(none)"
	}
	return "`" + v + "`"
}

// readmeFlags are the flags the README lists: the ones a newcomer needs
// (docs/flags.md lists every flag).
var readmeFlags = []string{"config", "grpc-addr", "http-addr", "debug-addr", "backend", "redis-url", "redis-mode", "shadow-mode", "headers", "log-level"}

// readmeFlagTable renders the README's table of readmeFlags, each with its
// one-line doc.
func readmeFlagTable() string {
	defs := flagDefaults()
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	for _, name := range readmeFlags {
		for _, s := range settings {
			if s.name != name {
				continue
			}
			d := s.shown
			if d == "" {
				d = shownDefault(defs[s.name])
			}
			fmt.Fprintf(&b, "| `--%s` | %s | %s |\n", s.name, d, s.summary())
		}
	}
	b.WriteString("\nEvery other flag, with its default and its envoyproxy/ratelimit variables: [docs/flags.md](docs/flags.md).\n")
	return b.String()
}

// helpLineMax is the longest one-line doc -h prints (Markdown removed).
const helpLineMax = 90

// TestFlagHelpOneLine: every flag's -h doc and README line fits on one line.
func TestFlagHelpOneLine(t *testing.T) {
	for _, s := range settings {
		if n := len([]rune(helpText(s.summary()))); n > helpLineMax {
			t.Errorf("--%s: -h doc is %d characters, want at most %d (put the details in doc and a summary in sum)", s.name, n, helpLineMax)
		}
		if s.sum != "" && len(s.sum) >= len(s.doc) {
			t.Errorf("--%s: sum is no shorter than doc; drop it", s.name)
		}
	}
	var b bytes.Buffer
	if _, _, err := Parse([]string{"-h"}, func(string) (string, bool) { return "", false }, &b); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	for _, l := range strings.Split(b.String(), "\n") {
		if doc, ok := strings.CutPrefix(l, "    \t"); ok {
			doc, _, _ = strings.Cut(doc, " (default ")
			if n := len([]rune(doc)); n > helpLineMax {
				t.Errorf("-h line %q: %d characters, want at most %d", doc, n, helpLineMax)
			}
		}
	}
	for _, name := range readmeFlags {
		if !slices.ContainsFunc(settings, func(s setting) bool { return s.name == name }) {
			t.Errorf("readmeFlags: no setting %q", name)
		}
	}
}

// flagsDoc renders docs/flags.md: every setting by group, with its
// environment twin and envoyproxy/ratelimit variables.
func flagsDoc() string {
	defs := flagDefaults()
	joined := map[string]bool{}
	for _, s := range settings {
		joined[s.joins] = true
	}
	var b strings.Builder
	b.WriteString(`# ratelimitd serve flags

<!-- Generated from internal/serveopts/settings.go by ` + "`go test ./internal/serveopts -run TestFlagDocs -update`" + `; edit the table there. -->

Every flag of ` + "`ratelimitd serve`" + ` has an environment twin, ` + "`RATELIMITD_`" + ` and the flag name
in upper snake case. Precedence: the flag, then its twin, then the envoyproxy/ratelimit variables
([migrating.md](migrating.md)), then the default. A variable in the "envoyproxy/ratelimit" column
set in plain type is read as the flag would read it; one in italics reaches the setting through its
own rules (see migrating.md). ` + "`ratelimitd serve -h`" + ` prints a one-line summary of each.
`)
	for _, g := range groupOrder {
		fmt.Fprintf(&b, "\n## %s\n\n| flag | environment | envoyproxy/ratelimit | default | meaning |\n|---|---|---|---|---|\n", g)
		for _, s := range settings {
			if s.group != g {
				continue
			}
			var legacy []string
			for _, l := range s.legacy {
				legacy = append(legacy, "`"+l+"`")
			}
			if s.legacyVia != "" {
				for _, l := range strings.Split(s.legacyVia, ", ") {
					legacy = append(legacy, "_`"+l+"`_")
				}
			}
			doc := strings.ReplaceAll(s.doc, "](docs/", "](")
			doc = strings.ReplaceAll(doc, "](README.md", "](../README.md")
			def := shownDefault(defs[s.name])
			if s.shown != "" && !joined[s.name] {
				def = s.shown
			}
			fmt.Fprintf(&b, "| `--%s` | `%s` | %s | %s | %s |\n", s.name, envName(s.name), strings.Join(legacy, ", "), def, doc)
		}
	}
	return b.String()
}

// TestFlagDocs fails when README.md's flag table or docs/flags.md differs
// from what the settings table renders (-update rewrites them).
func TestFlagDocs(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	i, j := bytes.Index(readme, []byte(readmeBegin)), bytes.Index(readme, []byte(readmeEnd))
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the markers %q ... %q", readmeBegin, readmeEnd)
	}
	wantReadme := string(readme[:i+len(readmeBegin)]) + readmeFlagTable() + string(readme[j:])
	for _, f := range []struct{ path, want string }{{"../../README.md", wantReadme}, {"../../docs/flags.md", flagsDoc()}} {
		got, _ := os.ReadFile(f.path)
		if string(got) == f.want {
			continue
		}
		if *updateFlagDocs {
			if err := os.WriteFile(f.path, []byte(f.want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("%s differs from the settings table; run go test ./internal/serveopts -run TestFlagDocs -update", f.path)
	}
}
