package helm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
	"github.com/ratelimitd/ratelimitd/internal/testproc"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

func TestMain(m *testing.M) { deploytest.Main(m) }

// literalEnv returns the container's env with literal values as NAME=value
// (valueFrom entries are resolved by the kubelet, not known here).
func literalEnv(c *corev1.Container) []string {
	var out []string
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			out = append(out, e.Name+"="+e.Value)
		}
	}
	return out
}

var flagLine = regexp.MustCompile(`(?m)^\s+-{1,2}([a-z][a-z0-9-]*)`)

// TestArgsParseWithTheRealFlagParser runs the built binary's own parser
// over every combination's container args and RATELIMITD_* environment:
// `ratelimitd serve <args> -h` parses every arg (and every environment
// twin) with the real flag set, types included, before it reaches -h and
// exits 0; an unknown flag or a bad value exits 2 naming it.
func TestArgsParseWithTheRealFlagParser(t *testing.T) {
	bin := deploytest.Ratelimitd(t)
	help, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range flagLine.FindAllSubmatch(help, -1) {
		flags[string(m[1])] = true
	}
	if !flags["redis-password-file"] || !flags["config"] {
		t.Fatalf("could not read the flags from `ratelimitd serve -h`:\n%s", help)
	}
	for name, values := range combos {
		t.Run(name, func(t *testing.T) {
			_, c := deployment(t, render(t, values))
			for flag := range args(t, c) {
				if !flags[flag] {
					t.Errorf("--%s is no `ratelimitd serve` flag", flag)
				}
			}
			for _, e := range c.Env {
				if twin, ok := strings.CutPrefix(e.Name, "RATELIMITD_"); ok {
					if f := strings.ToLower(strings.ReplaceAll(twin, "_", "-")); !flags[f] {
						t.Errorf("env %s is the twin of no flag (--%s)", e.Name, f)
					}
				}
			}
			cmd := exec.Command(bin, append(append([]string{"serve"}, c.Args...), "-h")...)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, literalEnv(c)...)
			out, err := cmd.CombinedOutput()
			if err != nil || !bytes.HasPrefix(out, []byte("Usage: ratelimitd serve")) {
				t.Errorf("ratelimitd serve %q -h: %v\n%s", c.Args, err, firstLines(out, 3))
			}
		})
	}
	// The check can fail: an unknown flag and a bad value.
	for _, bad := range [][]string{{"--redis-pasword-file=/x"}, {"--gc-percent=lots"}, {"--drain=5"}} {
		out, err := exec.Command(bin, append(append([]string{"serve"}, bad...), "-h")...).CombinedOutput()
		if err == nil {
			t.Errorf("ratelimitd serve %q -h accepted it:\n%s", bad, firstLines(out, 3))
		}
	}
}

func firstLines(b []byte, n int) string {
	l := strings.SplitN(string(b), "\n", n+1)
	if len(l) > n {
		l = l[:n]
	}
	return strings.Join(l, "\n")
}

// TestRenderedPodServesAgainstRedis runs the rendered container locally as
// the kubelet would (volumes laid out as the kubelet lays them out; only
// mount paths, listen addresses and the Redis address rewritten) against a
// redis-server that requires a password: a decision counted in Redis proves
// the password reaches ratelimitd through --redis-password-file.
func TestRenderedPodServesAgainstRedis(t *testing.T) {
	const password = "chart-e2e-pw-7f3a"
	srv := redistest.Standalone(t, redistest.WithPassword(password))

	r := render(t, "redis: {enabled: false, url: 'redis://redis:6379/0', existingSecret: ratelimitd-redis}\n")
	secrets := map[string]map[string]string{"ratelimitd-redis": {"password": password + "\n"}}
	pod := runPod(t, r, secrets, map[string]string{"redis": srv.Addr()})
	if strings.Contains(strings.Join(pod.argv, " "), password) {
		t.Fatalf("the password is on the command line: %q", pod.argv)
	}
	pod.decide(t)
	requireKeys(t, srv, pod)
	if strings.Contains(pod.log.String(), password) {
		t.Errorf("the password appears in ratelimitd's log")
	}
}

// TestDefaultInstallCounts: `helm install` with no values counts every
// decision. The chart's Redis runs as a real redis-server with its rendered
// arguments (the port aside) and the ratelimitd pod with its rendered args
// pointed at it: a decision leaves its key in that Redis.
func TestDefaultInstallCounts(t *testing.T) {
	r := render(t, "")
	ss := one[appsv1.StatefulSet](t, r, "apps/v1/StatefulSet")
	checkBundledRedis(t, r, must(deployment(t, r)))
	rc := ss.Spec.Template.Spec.Containers[0]
	var args []string
	for i := 0; i < len(rc.Args); i++ {
		if rc.Args[i] == "--port" {
			i++ // the test server's own port
			continue
		}
		args = append(args, rc.Args[i])
	}
	srv := redistest.Standalone(t, redistest.WithArgs(args...))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := srv.Client().ConfigGet(ctx, "maxmemory-policy").Result(); err != nil || got["maxmemory-policy"] != "noeviction" {
		t.Fatalf("redis-server with the chart's args: maxmemory-policy %v, %v", got, err)
	}
	svc := serviceNamed(t, r, ss.Spec.ServiceName)
	pod := runPod(t, r, nil, map[string]string{svc.Name + "." + svc.Namespace + ".svc": srv.Addr()})
	pod.decide(t)
	requireKeys(t, srv, pod)
}

// TestRenderedPodServesAgainstMemcache: backend memcache as rendered,
// against a real memcached: decisions are counted there (the second
// decision sees the first).
func TestRenderedPodServesAgainstMemcache(t *testing.T) {
	mc := memcachetest.Start(t)
	// A generous timeout: the timeout is not under test.
	r := render(t, "backend: memcache\nmemcache: {addrs: ['memcached-0.cache:11211'], timeout: 5s}\n")
	pod := runPod(t, r, nil, nil, func(name, val string) string {
		if name == "memcache-addrs" {
			return mc.Addr()
		}
		return val
	})
	first, second := pod.decide(t), pod.decide(t)
	if first-second != 1 {
		t.Fatalf("limit_remaining %d then %d: the decisions were not counted in memcached\n%s", first, second, pod.log.String())
	}
}

// pod is a rendered ratelimitd container running as a local process.
type pod struct {
	httpAddr string
	argv     []string
	log      interface{ String() string }
}

// runPod starts the rendered Deployment's container with its volumes laid
// out (secrets: test data of the Secrets it mounts), the listen addresses
// on free loopback ports, each --redis-url host found in hosts replaced
// by its address, and then each arg passed through rewrite. It waits for
// /healthcheck to answer (the config in force).
func runPod(t *testing.T, r release, secrets map[string]map[string]string, hosts map[string]string, rewrite ...func(name, val string) string) *pod {
	t.Helper()
	p, proc := startPod(t, r, secrets, hosts, rewrite...)
	// Ready: /healthcheck answers 200 once the config is in force (the
	// liveness path answers before).
	proc.WaitOK(t, "http://"+p.httpAddr+"/healthcheck", 60*time.Second)
	return p
}

// startPod is runPod without the wait for /healthcheck: it returns once
// ratelimitd has bound its listeners, starting it again on fresh ports
// when one was taken before it bound it.
func startPod(t *testing.T, r release, secrets map[string]map[string]string, hosts map[string]string, rewrite ...func(name, val string) string) (*pod, *deploytest.Process) {
	t.Helper()
	bin := deploytest.Ratelimitd(t)
	d, c := deployment(t, r)
	mounts := layOutVolumes(t, r, d, c, secrets)
	var p *pod
	var proc *deploytest.Process
	err := testproc.StartRetrying("ratelimitd serve", func() error {
		p = &pod{httpAddr: deploytest.FreeAddr(t)}
		for _, a := range c.Args {
			name, val, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			switch name {
			case "grpc-addr", "metrics-addr", "debug-addr":
				val = deploytest.FreeAddr(t)
			case "http-addr":
				val = p.httpAddr
			case "redis-url":
				u, err := url.Parse(val)
				if err != nil {
					t.Fatal(err)
				}
				addr, ok := hosts[u.Hostname()]
				if !ok {
					t.Fatalf("--redis-url=%s: host %s is not among %v", val, u.Hostname(), hosts)
				}
				u.Host = addr
				val = u.String()
			default:
				for mp, dir := range mounts {
					if rest, ok := strings.CutPrefix(val, mp); ok && (rest == "" || strings.HasPrefix(rest, "/")) {
						val = dir + rest
					}
				}
			}
			for _, f := range rewrite {
				val = f(name, val)
			}
			p.argv = append(p.argv, "--"+name+"="+val)
		}
		cmd := exec.Command(bin, append([]string{"serve"}, p.argv...)...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, literalEnv(c)...)
		proc = deploytest.Start(t, cmd, 30*time.Second)
		p.log = proc.Log
		// ratelimitd binds every listener before it logs any.
		return proc.WaitUp(60*time.Second, proc.Logged("listening"))
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, proc
}

// TestBadConfigPodStaysAlive: a release whose config does not load runs a
// pod that the kubelet keeps (startup and liveness probe paths answer 200)
// but sends no traffic to (/healthcheck, the readiness twin, answers 500):
// restarting would not fix the config.
func TestBadConfigPodStaysAlive(t *testing.T) {
	r := render(t, "backend: memory\nconfig: {files: {ratelimitd.yaml: \"domain: example\\nbogus: 1\\n\"}}\n")
	_, c := deployment(t, r)
	p, proc := startPod(t, r, nil, nil)
	for name, pr := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe} {
		if pr.HTTPGet == nil {
			t.Fatalf("%s probe is not an HTTP GET: %+v", name, pr.ProbeHandler)
		}
		proc.WaitOK(t, "http://"+p.httpAddr+pr.HTTPGet.Path, 60*time.Second)
	}
	resp, err := http.Get("http://" + p.httpAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("/healthcheck = %d with a bad config, want 500 (not ready)", resp.StatusCode)
	}
	if !strings.Contains(p.log.String(), "bogus") {
		t.Errorf("the log does not report the bad config:\n%s", p.log.String())
	}
}

// decide sends one decision of the chart's default config (domain
// example, remote_address, 100 per minute) and returns its
// limit_remaining; it must be OK.
func (p *pod) decide(t *testing.T) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"domain": "example", "descriptors": []any{
		map[string]any{"entries": []any{map[string]string{"key": "remote_address", "value": "192.0.2.7"}}},
	}})
	resp, err := http.Post("http://"+p.httpAddr+"/json", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST /json: %v", err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ans struct {
		OverallCode string `json:"overallCode"`
		Statuses    []struct {
			LimitRemaining int `json:"limitRemaining"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal(out, &ans); err != nil || resp.StatusCode != http.StatusOK || ans.OverallCode != "OK" || len(ans.Statuses) != 1 {
		t.Fatalf("POST /json: %d %s (%v)\n%s", resp.StatusCode, out, err, p.log.String())
	}
	return ans.Statuses[0].LimitRemaining
}

// requireKeys fails unless srv holds a key (a counted decision).
func requireKeys(t *testing.T, srv *redistest.Server, p *pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := srv.Client().DBSize(ctx).Result()
	if err != nil {
		t.Fatalf("DBSIZE: %v", err)
	}
	if n == 0 {
		t.Fatalf("the decision left no key in Redis:\n%s", p.log.String())
	}
}

// layOutVolumes writes every volume the container mounts into a directory
// of its own, as the kubelet's atomic writer lays out ConfigMap and Secret
// volumes (..data symlinks, items projected), and returns mount path ->
// directory.
func layOutVolumes(t *testing.T, r release, d *appsv1.Deployment, c *corev1.Container, secrets map[string]map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range c.VolumeMounts {
		var data map[string]string
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			switch {
			case v.ConfigMap != nil:
				for _, cm := range byKind[corev1.ConfigMap](r, "v1/ConfigMap") {
					if cm.Name == v.ConfigMap.Name {
						data = cm.Data
					}
				}
				if data == nil {
					t.Fatalf("volume %s: ConfigMap %s is not rendered", v.Name, v.ConfigMap.Name)
				}
			case v.Secret != nil:
				s, ok := secrets[v.Secret.SecretName]
				if !ok {
					t.Fatalf("volume %s: no test data for Secret %s", v.Name, v.Secret.SecretName)
				}
				data = map[string]string{}
				if len(v.Secret.Items) == 0 {
					data = s
				}
				for _, it := range v.Secret.Items {
					val, ok := s[it.Key]
					if !ok {
						t.Fatalf("volume %s: Secret %s has no key %s", v.Name, v.Secret.SecretName, it.Key)
					}
					data[it.Path] = val
				}
			default:
				t.Fatalf("volume %s: neither ConfigMap nor Secret", v.Name)
			}
		}
		out[m.MountPath] = deploytest.KubeletVolume(t, data)
	}
	return out
}
