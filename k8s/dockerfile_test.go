package k8s_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
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
	// Final stage: ENV settings, WORKDIR, and every COPY as source and
	// destination ("--from=stage src" for stage copies).
	env      map[string]string
	workdir  string
	copyDest map[string]string
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
			d.env, d.workdir, d.copyDest = map[string]string{}, "", map[string]string{}
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Errorf("ENV %s: use the key=value form", rest)
				}
				d.env[k] = v
			}
		case "WORKDIR":
			d.workdir = rest
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
			d.copyDest[strings.Join(f[:len(f)-1], " ")] = f[len(f)-1]
		case "RUN":
			d.runs = append(d.runs, rest)
		}
	}
	return d
}

// TestDockerfile checks the image runs the static binary as non-root on a
// minimal base, exposes the ports the Deployment uses, and builds with
// CGO_ENABLED=0, -trimpath and the version ldflags.
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

// TestDockerfileReferenceDropIn: the image is a drop-in for
// envoyproxy/ratelimit's. No ENV of the image sets a RATELIMITD_* variable
// (it would outrank the reference's variables, such as RUNTIME_ROOT); the
// shipped config is the binary's default ./config from the WORKDIR; and
// /bin/ratelimit, the path Istio's and Envoy Gateway's manifests run, is a
// symlink to the binary, copied as a directory so that it stays one.
func TestDockerfileReferenceDropIn(t *testing.T) {
	d := parseDockerfile(t)
	for k := range d.env {
		if strings.HasPrefix(k, "RATELIMITD_") {
			t.Errorf("final stage ENV %s: it would outrank envoyproxy/ratelimit's variables (RUNTIME_ROOT, REDIS_URL, ...)", k)
		}
	}
	if dst := d.copyDest["examples/config/"]; filepath.Clean(dst) != filepath.Join(d.workdir, "config") {
		t.Errorf("examples/config is copied to %q, WORKDIR is %q: the default --config ./config must find it", dst, d.workdir)
	}
	if !filepath.IsAbs(d.workdir) {
		t.Errorf("WORKDIR %q: want an absolute path", d.workdir)
	}
	if d.copyDest["--from=build /out/bin/"] != "/bin/" {
		t.Errorf("final stage lacks COPY --from=build /out/bin/ /bin/ (copies: %v)", d.copyDest)
	}
	if d.copyDest["--from=build /out/ratelimitd"] != d.entrypoint[0] {
		t.Errorf("the binary is not copied to the ENTRYPOINT %s", d.entrypoint[0])
	}
	link := false
	for _, r := range d.runs {
		if strings.Contains(r, "ln -s "+d.entrypoint[0]+" /out/bin/ratelimit") {
			link = true
		}
	}
	if !link {
		t.Errorf("no build step runs ln -s %s /out/bin/ratelimit", d.entrypoint[0])
	}
}

// TestImageServesReferenceEnvironment runs the binary as the image runs
// it, in a directory laid out as the image (WORKDIR with the shipped
// config, bin/ratelimit a symlink to the binary) with the image's ENV:
//
//   - the ENTRYPOINT with no other environment serves the shipped config;
//   - the ENTRYPOINT and /bin/ratelimit with no arguments (Istio's
//     sample: command /bin/ratelimit) under an envoyproxy/ratelimit
//     environment serve RUNTIME_ROOT's config, not the shipped one, in
//     reference mode.
func TestImageServesReferenceEnvironment(t *testing.T) {
	bin := buildRatelimitd(t)
	df := parseDockerfile(t)
	root := t.TempDir()
	work := filepath.Join(root, filepath.FromSlash(df.workdir))
	if err := os.CopyFS(filepath.Join(work, "config"), os.DirFS("../examples/config")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "bin", "ratelimit")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(root, "data", "ratelimit", "config")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "mine.yaml"), []byte("domain: mine\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	redis := redistest.Standalone(t)
	reference := []string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr(), "USE_STATSD=false",
		"RUNTIME_ROOT=" + filepath.Join(root, "data"), "RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true", "LOG_FORMAT=json",
	}
	for _, tc := range []struct {
		name   string
		argv   []string
		env    []string
		domain string // served
		mode   string
	}{
		{"entrypoint, no environment", []string{bin, df.entrypoint[1]}, nil, "example", "native"},
		{"entrypoint, reference environment", []string{bin, df.entrypoint[1]}, reference, "mine", "reference"},
		{"/bin/ratelimit, reference environment", []string{link}, reference, "mine", "reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ports []string
			var logs func() string
			// Fresh ports on each start: one may be taken before the
			// process binds it.
			err := testproc.StartRetrying(tc.name, func() error {
				env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + root}
				for k, v := range df.env {
					env = append(env, k+"="+v)
				}
				ports = deploytest.FreePorts(t, 3)
				env = append(env, "GRPC_HOST=127.0.0.1", "GRPC_PORT="+ports[0], "HOST=127.0.0.1", "PORT="+ports[1],
					"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+ports[2])
				env = append(env, tc.env...)
				var done <-chan struct{}
				logs, done = startImageProcess(t, work, tc.argv, env)
				return waitListening(logs, done, 30*time.Second)
			})
			if err != nil {
				t.Fatal(err)
			}
			cc, err := grpc.NewClient("127.0.0.1:"+ports[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			client := rlsv3.NewRateLimitServiceClient(cc)
			var loaded []string
			deadline := time.Now().Add(30 * time.Second)
			for {
				loaded = nil
				for _, dom := range []string{"example", "mine"} {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: dom, Descriptors: []*rlcommon.RateLimitDescriptor{
						{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}},
						{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}},
					}})
					cancel()
					if err == nil && (resp.GetStatuses()[0].GetCurrentLimit() != nil || resp.GetStatuses()[1].GetCurrentLimit() != nil) {
						loaded = append(loaded, dom)
					}
				}
				if len(loaded) > 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !slices.Equal(loaded, []string{tc.domain}) {
				t.Errorf("domains with limits %v, want [%s]\n%s", loaded, tc.domain, logs())
			}
			if l := logs(); !strings.Contains(l, `"mode":"`+tc.mode+`"`) && !strings.Contains(l, " mode="+tc.mode+" ") {
				t.Errorf("no startup line with mode %s\n%s", tc.mode, logs())
			}
		})
	}
}

// waitListening waits until a ratelimitd started by startImageProcess has
// logged its listeners (it binds them all before logging any). It returns
// an error when the process exits first (wrapping testproc.ErrPortInUse
// when a bind failed) or within passes.
func waitListening(logs func() string, done <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	for !strings.Contains(logs(), "listening") {
		select {
		case <-done:
			if testproc.PortInUse(logs()) {
				return fmt.Errorf("exited during startup: %w\n%s", testproc.ErrPortInUse, logs())
			}
			return fmt.Errorf("exited during startup:\n%s", logs())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no listeners logged within %v:\n%s", within, logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// startImageProcess starts argv in dir with env and stops it (SIGTERM,
// then SIGKILL) at cleanup; logs returns its stderr so far, and done is
// closed once it has exited.
func startImageProcess(t *testing.T, dir string, argv, env []string) (logs func() string, exited <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	var mu sync.Mutex
	var buf bytes.Buffer
	cmd.Stderr = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }, done
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
