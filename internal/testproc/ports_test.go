package testproc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// childEnv selects the role this test binary plays when re-executed:
// "listen:<port>" listens on 127.0.0.1:<port> (printing Go's error and
// exiting 1 when the bind fails, "listening" once bound), "pick:<n>"
// prints n ports from FreePorts; both then wait for stdin to close.
const childEnv = "TESTPROC_PORTS_CHILD"

func TestMain(m *testing.M) {
	if role, ok := os.LookupEnv(childEnv); ok {
		os.Exit(child(role))
	}
	os.Exit(m.Run())
}

func child(role string) int {
	kind, arg, _ := strings.Cut(role, ":")
	n, err := strconv.Atoi(arg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch kind {
	case "listen":
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", arg))
		if err != nil {
			fmt.Fprintln(os.Stderr, "listen:", err)
			return 1
		}
		defer func() { _ = l.Close() }()
		fmt.Println("listening")
	case "pick":
		ps, err := freePorts(n)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(strings.Trim(fmt.Sprint(ps), "[]"))
	default:
		return 2
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// startChild re-executes the test binary as role, with its stdout lines
// on the returned channel (closed once the child has exited and been
// waited for) and its stderr in cmd.Stderr (a *Buffer); closing stdin
// ends it.
func startChild(t *testing.T, role string) (lines <-chan string, cmd *exec.Cmd) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+role)
	var stderr Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	KillWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch <- sc.Text()
		}
		_ = cmd.Wait()
		close(ch) // after Wait: a reader that sees it closed may read cmd's state
		close(done)
	}()
	t.Cleanup(func() { _ = in.Close(); <-done })
	return ch, cmd
}

// TestFreePortsNeverRepeats: many goroutines choosing ports at once are
// never given one twice, although each choice releases its ports before
// the next (the kernel would hand a released port out again).
func TestFreePortsNeverRepeats(t *testing.T) {
	const goroutines, calls, per = 16, 40, 2
	var mu sync.Mutex
	seen := map[int]int{}
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range calls {
				for _, p := range FreePorts(t, per) {
					mu.Lock()
					seen[p]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if got, want := len(seen), goroutines*calls*per; got != want {
		var dup []int
		for p, n := range seen {
			if n > 1 {
				dup = append(dup, p)
			}
		}
		t.Errorf("%d distinct ports of %d handed out; repeated: %v", got, want, dup)
	}
}

// TestFreePortsAcrossProcesses: two other test processes choosing ports
// while this one does are never given a port this one or the other was
// given (each holds what it chose until it ends).
func TestFreePortsAcrossProcesses(t *testing.T) {
	const n = 300
	owner := map[int]string{}
	add := func(who string, ps []int) {
		for _, p := range ps {
			if o, dup := owner[p]; dup {
				t.Errorf("port %d given to %s and to %s", p, o, who)
			}
			owner[p] = who
		}
	}
	a, _ := startChild(t, "pick:"+strconv.Itoa(n))
	b, _ := startChild(t, "pick:"+strconv.Itoa(n))
	add("this process", FreePorts(t, n))
	for who, ch := range map[string]<-chan string{"child a": a, "child b": b} {
		line, ok := <-ch
		if !ok {
			t.Fatalf("%s printed no ports", who)
		}
		var ps []int
		for _, f := range strings.Fields(line) {
			p, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("%s: %q: %v", who, line, err)
			}
			ps = append(ps, p)
		}
		if len(ps) != n {
			t.Fatalf("%s printed %d ports, want %d", who, len(ps), n)
		}
		add(who, ps)
	}
}

// TestStartRetryingAfterPortTaken: a child process whose port was taken
// between the choice and its bind exits with "address already in use";
// StartRetrying starts it again on a fresh port, and gives up with a
// clear error after StartAttempts starts when every port is taken.
func TestStartRetryingAfterPortTaken(t *testing.T) {
	// start runs a listening child on a fresh port; while taken is
	// true, the port is bound by this process first, as another process
	// that got it between the choice and the child's bind would.
	start := func(taken func(attempt int) bool) (ports []int, err error) {
		err = StartRetrying("child listener", func() error {
			p := FreePort(t)
			ports = append(ports, p)
			if taken(len(ports)) {
				l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = l.Close() }()
			}
			lines, cmd := startChild(t, "listen:"+strconv.Itoa(p))
			if line, ok := <-lines; ok && line == "listening" {
				return nil
			}
			<-lines // closed once the child has been waited for
			var stderr string
			if b, ok := cmd.Stderr.(*Buffer); ok {
				stderr = b.String()
			}
			if PortInUse(stderr) {
				return fmt.Errorf("child on %d: %s: %w", p, strings.TrimSpace(stderr), ErrPortInUse)
			}
			return fmt.Errorf("child on %d exited: %v: %s", p, cmd.ProcessState, stderr)
		})
		return ports, err
	}

	ports, err := start(func(attempt int) bool { return attempt == 1 })
	if err != nil {
		t.Fatalf("with the first port taken: %v", err)
	}
	if len(ports) != 2 || ports[0] == ports[1] {
		t.Errorf("ports tried %v; want the taken one, then another that worked", ports)
	}

	ports, err = start(func(int) bool { return true })
	if !errors.Is(err, ErrPortInUse) || !strings.Contains(err.Error(), "child listener") || len(ports) != StartAttempts {
		t.Errorf("with every port taken: %d starts, error %v; want %d starts and a wrapped ErrPortInUse naming the child", len(ports), err, StartAttempts)
	}
}
