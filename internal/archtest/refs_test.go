package archtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// This file checks that what the repository cites is in the repository:
// markdown links and docs/... paths resolve to tracked files (and their
// #anchors to headings), and no file cites an issue-tracker number or a
// design document kept outside the repository. Its own patterns are built
// from pieces so that it does not match itself.

// tracked returns the files git tracks, as slash paths relative to the
// repository root.
func tracked(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func readRepo(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile("../../" + p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return b
}

var (
	// mdLink matches an inline link or image target: [text](target) or
	// [text](target "title").
	mdLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// mdRef matches a reference definition: [label]: target.
	mdRef = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+.*)?$`)
	// docsPath matches a path docs/<name>.md anywhere in a file.
	docsPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])(docs/[A-Za-z0-9_-][A-Za-z0-9_./-]*\.md)(#[A-Za-z0-9_-]+)?`)
	// htmlAnchor matches <a name="x"> or id="x" anchors in markdown.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	// inlineCode matches a `code span`, whose content is not a link.
	inlineCode = regexp.MustCompile("`[^`]*`")
)

// slug is GitHub's anchor for a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces turned into '-'.
func slug(h string) string {
	h = strings.TrimSpace(inlineCodeMarks.Replace(h))
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var inlineCodeMarks = strings.NewReplacer("`", "", "*", "", "[", "", "]", "")

// anchors returns the anchors of a markdown file: each heading's slug
// (repeated headings get -1, -2, … as GitHub numbers them) and explicit
// HTML anchors. Headings inside fenced code blocks do not count.
func anchors(src []byte) map[string]bool {
	res := map[string]bool{}
	seen := map[string]int{}
	mdLines(src, func(_ int, line string) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			res[m[1]] = true
		}
		h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			return
		}
		s := slug(strings.TrimRight(strings.TrimSpace(h), "#"))
		if n := seen[s]; n > 0 {
			res[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			res[s] = true
		}
		seen[s]++
	})
	return res
}

// mdLines calls f with each line of a markdown file (and its 1-based
// number) outside fenced code blocks.
func mdLines(src []byte, f func(n int, line string)) {
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if !fenced {
			f(n, line)
		}
	}
}

// mdTargets returns the link targets of a markdown file with their line
// numbers, outside fenced code blocks and code spans.
func mdTargets(src []byte) (targets []string, lines []int) {
	mdLines(src, func(n int, line string) {
		line = inlineCode.ReplaceAllString(line, "")
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			targets, lines = append(targets, m[1]), append(lines, n)
		}
		if m := mdRef.FindStringSubmatch(line); m != nil {
			targets, lines = append(targets, m[1]), append(lines, n)
		}
	})
	return targets, lines
}

// external reports whether a link target leaves the repository by design
// (a URL); such targets are not checked here.
func external(target string) bool {
	if i := strings.Index(target, ":"); i > 0 && !strings.ContainsAny(target[:i], "/#.") {
		return true // a scheme: https:, mailto:, …
	}
	return strings.HasPrefix(target, "//")
}

// repoRefs resolves file-relative or root-relative references against the
// tracked files.
type repoRefs struct {
	t       *testing.T
	files   map[string]bool
	dirs    map[string]bool
	anchors map[string]map[string]bool
}

func newRepoRefs(t *testing.T, files []string) *repoRefs {
	r := &repoRefs{t: t, files: map[string]bool{}, dirs: map[string]bool{}, anchors: map[string]map[string]bool{}}
	for _, f := range files {
		r.files[f] = true
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			r.dirs[d] = true
		}
	}
	return r
}

// check returns "" when p (a clean repository path) with optional anchor
// exists, else what is wrong.
func (r *repoRefs) check(p, anchor string) string {
	if p == "." || p == "" {
		p = ""
	}
	if strings.HasPrefix(p, "../") || p == ".." {
		return "leads outside the repository"
	}
	if !r.files[p] {
		if r.dirs[p] || p == "" {
			if anchor != "" {
				return "anchor on a directory"
			}
			return ""
		}
		return "no such tracked file"
	}
	if anchor == "" || !strings.HasSuffix(p, ".md") {
		return ""
	}
	a, ok := r.anchors[p]
	if !ok {
		a = anchors(readRepo(r.t, p))
		r.anchors[p] = a
	}
	if !a[strings.ToLower(anchor)] && !a[anchor] {
		return "no heading with anchor #" + anchor
	}
	return ""
}

// TestMarkdownLinksResolve: every relative link of a Markdown file names a
// tracked file, and its anchor a heading of that file.
func TestMarkdownLinksResolve(t *testing.T) {
	files := tracked(t)
	refs := newRepoRefs(t, files)
	checked := 0
	for _, f := range files {
		if !strings.HasSuffix(f, ".md") {
			continue
		}
		targets, lines := mdTargets(readRepo(t, f))
		for i, target := range targets {
			if external(target) {
				continue
			}
			p, anchor, _ := strings.Cut(target, "#")
			switch {
			case p == "":
				p = f // #anchor in the same file
			case strings.HasPrefix(p, "/"):
				p = path.Clean(strings.TrimPrefix(p, "/"))
			default:
				p = path.Clean(path.Join(path.Dir(f), p))
			}
			checked++
			if why := refs.check(p, anchor); why != "" {
				t.Errorf("%s:%d: link %q: %s", f, lines[i], target, why)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative markdown link found: the link pattern is broken")
	}
}

// TestDocsPathsResolve: every docs/...md path a tracked file cites exists,
// with its anchor.
func TestDocsPathsResolve(t *testing.T) {
	files := tracked(t)
	refs := newRepoRefs(t, files)
	checked := 0
	for _, f := range files {
		if !textFile(f) {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(readRepo(t, f)))
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			for _, m := range docsPath.FindAllStringSubmatch(sc.Text(), -1) {
				checked++
				if why := refs.check(path.Clean(m[1]), strings.TrimPrefix(m[2], "#")); why != "" {
					t.Errorf("%s:%d: %s%s: %s", f, n, m[1], m[2], why)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no docs/...md path found: the pattern is broken")
	}
}

// textFile reports whether f is a tracked source or documentation file the
// citation checks read: Go, Lua, shell, YAML, Markdown, Makefile,
// Dockerfile (testdata included, generated protobuf code excluded).
func textFile(f string) bool {
	if strings.HasSuffix(f, ".pb.go") {
		return false
	}
	for _, ext := range []string{".go", ".lua", ".sh", ".yaml", ".yml", ".md", ".tpl", ".proto"} {
		if strings.HasSuffix(f, ext) {
			return true
		}
	}
	base := path.Base(f)
	return base == "Makefile" || base == "Dockerfile"
}

// Citations that lead outside the repository. Built from pieces so that
// this file does not cite them.
var outsideCitations = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\bissue\s*#?\s*[0-9]+`),
	regexp.MustCompile(`(?i)\b(contract|specs)` + `\.md\b`),
	regexp.MustCompile(`(?i)\breference` + `-semantics\b`),
	regexp.MustCompile(`\.\./` + `shared\b`),
	regexp.MustCompile(`/work/` + `shared\b`),
	// Section numbers and names of those documents.
	regexp.MustCompile(`(?i)\breference ` + `§?[0-9]+\.[0-9]+`),
	regexp.MustCompile(`(?i)\bthe ` + `contract\b`),
	regexp.MustCompile(`(?i)\bsettled ` + `details\b`),
}

// archDoc matches any path ending in architecture.md; only the one in
// docs/ exists.
var archDoc = regexp.MustCompile(`[A-Za-z0-9_./-]*\barchitecture` + `\.md\b`)

// TestNoCitationOutsideRepository: no tracked file cites a file outside the
// repository, and only docs/architecture.md is cited as the repository's
// map.
func TestNoCitationOutsideRepository(t *testing.T) {
	for _, f := range tracked(t) {
		if !textFile(f) || f == "internal/archtest/refs_test.go" {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(readRepo(t, f)))
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			for _, re := range outsideCitations {
				if m := re.FindString(line); m != "" {
					t.Errorf("%s:%d: cites %q, which is not in the repository: state what the code relies on in docs/ and cite that", f, n, m)
				}
			}
			for _, m := range archDoc.FindAllString(line, -1) {
				p := path.Clean(m)
				if p == "docs/architecture.md" || (strings.HasPrefix(f, "docs/") && path.Clean(path.Join(path.Dir(f), m)) == "docs/architecture.md") {
					continue
				}
				t.Errorf("%s:%d: cites %q; the map of the repository is docs/architecture.md", f, n, m)
			}
		}
	}
}

// TestCitationPatterns keeps the patterns above honest: each must catch
// its example and let the allowed forms through.
func TestCitationPatterns(t *testing.T) {
	bad := []string{"see issue 3 item 5", "(Issue #12)", "per contract" + ".md", "reference" + "-semantics 1.4", "../" + "shared/design",
		"(reference " + "1.5)", "the " + "contract's defaults", "Settled " + "details"}
	for _, s := range bad {
		hit := false
		for _, re := range outsideCitations {
			hit = hit || re.MatchString(s)
		}
		if !hit {
			t.Errorf("%q is not caught", s)
		}
	}
	for _, s := range []string{"issues are tracked on GitHub", "the reference semantics", "docs/responses.md", "the Store contract", "the porting contract", "RFC 9651 (§3.3.1)"} {
		for _, re := range outsideCitations {
			if re.MatchString(s) {
				t.Errorf("%q is caught by %v", s, re)
			}
		}
	}
	if got := anchors([]byte("# A `b` title!\n## Same\n## Same\n```\n# not\n```\n<a name=\"x\"></a>\n")); !got["a-b-title"] || !got["same"] || !got["same-1"] || got["not"] || !got["x"] {
		t.Errorf("anchors = %v", got)
	}
}
