package k8s_test

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dockerfile is the parsed root Dockerfile: instructions of the final stage
// and the build stage's RUN lines (continuations joined).
type dockerfile struct {
	finalFrom  string
	user       string
	entrypoint []string
	expose     []int
	copies     []string // COPY sources of the final stage (build context paths)
	runs       []string // every RUN, all stages
}

func parseDockerfile(t *testing.T) dockerfile {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\") + " ")
			continue
		}
		cur.WriteString(l)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	var d dockerfile
	for _, l := range lines {
		ins, rest, _ := strings.Cut(l, " ")
		switch strings.ToUpper(ins) {
		case "FROM":
			f := strings.Fields(rest)
			d.finalFrom = f[len(f)-1]
			if len(f) >= 3 && strings.EqualFold(f[len(f)-2], "AS") {
				d.finalFrom = f[len(f)-3]
			}
			d.user, d.entrypoint, d.expose, d.copies = "", nil, nil, nil
		case "USER":
			d.user = rest
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.entrypoint); err != nil {
				t.Errorf("ENTRYPOINT must be exec form (JSON), got %s", rest)
			}
		case "EXPOSE":
			for _, p := range strings.Fields(rest) {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					t.Errorf("EXPOSE %s: %v", p, err)
				}
				d.expose = append(d.expose, n)
			}
		case "COPY":
			f := strings.Fields(rest)
			if !strings.HasPrefix(f[0], "--from") {
				d.copies = append(d.copies, f[:len(f)-1]...)
			}
		case "RUN":
			d.runs = append(d.runs, rest)
		}
	}
	return d
}

// TestDockerfile checks the image runs the static binary as non-root on a
// minimal base, exposes the ports the Deployment uses, and builds with the
// flags the issue asks for.
func TestDockerfile(t *testing.T) {
	d := parseDockerfile(t)
	if !strings.HasPrefix(d.finalFrom, "gcr.io/distroless/static") && d.finalFrom != "scratch" {
		t.Errorf("final stage FROM %s: want distroless/static or scratch", d.finalFrom)
	}
	uid, _, _ := strings.Cut(d.user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("USER %q: want a numeric non-root uid (runAsNonRoot can only verify numbers)", d.user)
	}
	if !slices.Equal(d.entrypoint, []string{"/ratelimitd", "serve"}) {
		t.Errorf("ENTRYPOINT %v, want [/ratelimitd serve]", d.entrypoint)
	}
	for _, p := range []int{8081, 8080} {
		if !slices.Contains(d.expose, p) {
			t.Errorf("EXPOSE lacks %d", p)
		}
	}
	build := ""
	for _, r := range d.runs {
		if strings.Contains(r, "go build") {
			build = r
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=", "./cmd/ratelimitd"} {
		if !strings.Contains(build, want) {
			t.Errorf("go build step lacks %q: %s", want, build)
		}
	}
	// The Deployment agrees with the image.
	_, c := ratelimitd(t, render(t, "base"))
	d2, _ := ratelimitd(t, render(t, "base"))
	if u := d2.Spec.Template.Spec.SecurityContext.RunAsUser; u == nil || strconv.FormatInt(*u, 10) != uid {
		t.Errorf("pod runAsUser %v differs from the image USER %s", u, uid)
	}
	for _, cp := range c.Ports {
		if cp.Name != "metrics" && !slices.Contains(d.expose, int(cp.ContainerPort)) {
			t.Errorf("container port %s/%d is not EXPOSEd", cp.Name, cp.ContainerPort)
		}
	}
}

// TestDockerBuildStatic runs the Dockerfile's build command outside
// Docker: the result must be a static executable (no ELF interpreter)
// that reports the version set by -ldflags.
func TestDockerBuildStatic(t *testing.T) {
	out := buildRatelimitd(t) // built with the Dockerfile's flags; skips while cmd does not build
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("binary has an ELF interpreter: not static, it will not start on distroless/static")
		}
	}
	v, err := runCmd(out, "version")
	if err != nil || !strings.Contains(string(v), testVersion) {
		t.Errorf("ratelimitd version = %q (%v): the -X main.version ldflag does not reach the binary", v, err)
	}
}

// TestDockerignore: the build context keeps every file the build needs.
// Only the pattern forms used in .dockerignore are understood (dir, glob,
// **/glob, !exception); another form fails the test.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	type rule struct {
		pat    string
		negate bool
	}
	var rules []rule
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		r := rule{pat: l}
		if strings.HasPrefix(l, "!") {
			r = rule{pat: l[1:], negate: true}
		}
		if strings.Contains(strings.TrimPrefix(r.pat, "**/"), "**") {
			t.Fatalf(".dockerignore pattern %q: form not understood by this test", l)
		}
		rules = append(rules, r)
	}
	match := func(pat, p string) bool {
		if rest, ok := strings.CutPrefix(pat, "**/"); ok {
			parts := strings.Split(p, "/")
			for i := range parts {
				if ok, _ := filepath.Match(rest, strings.Join(parts[i:], "/")); ok {
					return true
				}
				if ok, _ := filepath.Match(rest, parts[i]); ok && i < len(parts)-1 {
					return true // a directory
				}
			}
			return false
		}
		for q := p; q != "." && q != "/"; q = filepath.Dir(q) {
			if ok, _ := filepath.Match(pat, q); ok {
				return true
			}
		}
		return false
	}
	ignored := func(p string) bool {
		ig := false
		for _, r := range rules {
			if match(r.pat, p) {
				ig = !r.negate
			}
		}
		return ig
	}
	// What the build needs: go.mod, go.sum, every source and embedded file
	// of ./cmd/ratelimitd's in-module dependencies, and the COPY sources.
	need := []string{"go.mod", "go.sum"}
	list := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if eq .Module.Path "github.com/ratelimitd/ratelimitd"}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}
{{end}}{{end}}{{end}}`, "../cmd/ratelimitd")
	outb, err := list.Output()
	if err != nil {
		t.Fatalf("go list ./cmd/ratelimitd: %v", err)
	}
	root, _ := filepath.Abs("..")
	for _, l := range strings.Split(strings.TrimSpace(string(outb)), "\n") {
		if rel, err := filepath.Rel(root, l); err == nil && l != "" {
			need = append(need, rel)
		}
	}
	for _, c := range parseDockerfile(t).copies {
		c = strings.TrimSuffix(c, "/")
		filepath.WalkDir(filepath.Join("..", c), func(p string, de os.DirEntry, err error) error {
			if err == nil && !de.IsDir() {
				rel, _ := filepath.Rel("..", p)
				need = append(need, rel)
			}
			return nil
		})
	}
	if len(need) < 10 {
		t.Fatalf("only %d needed files found", len(need))
	}
	for _, p := range need {
		if ignored(filepath.ToSlash(p)) {
			t.Errorf(".dockerignore excludes %s, which the build needs", p)
		}
	}
	for _, p := range []string{".git/config", "k8s/base/deployment.yaml", "pkg/policy/load_test.go"} {
		if !ignored(p) {
			t.Errorf(".dockerignore keeps %s, which the image does not need", p)
		}
	}
}
