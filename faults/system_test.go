package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hermeshost/internal/hosttest"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
)

// What the suite owns: a Postgres cluster, a dockerd, tmpfs mounts and the product's
// processes, each started by the suite and stopped and removed when the test ends, even
// when it fails.

// run runs a command to its end and fails the test with its output on an error.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// pgCluster is a Postgres cluster of the suite's own: initdb as the postgres user into a
// folder of the suite's, its own port, listening on 127.0.0.1 only.
type pgCluster struct {
	dir, bin string
	port     int
}

func startPostgres(t testing.TB, root string) *pgCluster {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Fatal("no Postgres server binaries (/usr/lib/postgresql/*/bin; apt-get install postgresql)")
	}
	sort.Strings(bins)
	c := &pgCluster{dir: filepath.Join(root, "pg"), bin: filepath.Dir(bins[len(bins)-1]), port: hosttest.FreePort(t)}
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "chown", "postgres:postgres", c.dir)
	run(t, "runuser", "-u", "postgres", "--", filepath.Join(c.bin, "initdb"), "-D", c.dir, "-U", "postgres",
		"--auth-local=peer", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8")
	t.Cleanup(func() {
		// Immediate: whatever state the suite left it in, it goes.
		_ = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(c.bin, "pg_ctl"), "-D", c.dir, "-m", "immediate", "-w", "stop").Run()
	})
	c.start(t)
	c.psql(t, "CREATE ROLE hermes LOGIN PASSWORD 'hermes'")
	c.psql(t, "CREATE DATABASE hermes OWNER hermes")
	return c
}

func (c *pgCluster) url() string {
	return fmt.Sprintf("postgres://hermes:hermes@127.0.0.1:%d/hermes?sslmode=disable", c.port)
}

func (c *pgCluster) start(t testing.TB) {
	t.Helper()
	run(t, "runuser", "-u", "postgres", "--", filepath.Join(c.bin, "pg_ctl"), "-D", c.dir, "-l", filepath.Join(c.dir, "server.log"),
		"-w", "-t", "60", "-o", fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=200", c.port, c.dir), "start")
}

// crash stops the cluster as a power cut would (immediate mode: no checkpoint, recovery
// at the next start).
func (c *pgCluster) crash(t testing.TB) {
	t.Helper()
	run(t, "runuser", "-u", "postgres", "--", filepath.Join(c.bin, "pg_ctl"), "-D", c.dir, "-m", "immediate", "-w", "stop")
}

func (c *pgCluster) psql(t testing.TB, sql string) {
	t.Helper()
	run(t, "runuser", "-u", "postgres", "--", filepath.Join(c.bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-h", c.dir, "-p", strconv.Itoa(c.port), "-d", "postgres", "-c", sql)
}

// dockerd is a Docker engine of the suite's own beside the machine's: its own socket, data,
// exec root and pid file under the suite's folder, no iptables or default bridge, and its
// networks from a pool no other engine here uses.
type dockerd struct {
	dir, sock string
	engine    *client.Client
	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
}

func startDockerd(t testing.TB, root string) *dockerd {
	t.Helper()
	if _, err := exec.LookPath("dockerd"); err != nil {
		t.Fatal("no dockerd (apt-get install docker.io): ", err)
	}
	d := &dockerd{dir: filepath.Join(root, "docker")}
	d.sock = filepath.Join(d.dir, "docker.sock")
	if err := os.Mkdir(d.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	engine, err := client.NewClientWithOpts(client.WithHost("unix://"+d.sock), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	d.engine = engine
	t.Cleanup(func() { d.remove(t) })
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *dockerd) host() string { return "unix://" + d.sock }

// start starts the daemon and waits until it answers.
func (d *dockerd) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	logf, err := os.OpenFile(filepath.Join(d.dir, "dockerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command("dockerd", "-H", d.host(), "--data-root", filepath.Join(d.dir, "data"),
		"--exec-root", filepath.Join(d.dir, "exec"), "--pidfile", filepath.Join(d.dir, "dockerd.pid"),
		"--iptables=false", "--ip-masq=false", "--bridge=none",
		"--default-address-pool", "base=10.213.0.0/16,size=24")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Should the test process die, the daemon stops (and stops its containers).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	d.cmd, d.done = cmd, done
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := d.engine.Ping(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("dockerd exited at start (see %s)", filepath.Join(d.dir, "dockerd.log"))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dockerd did not answer within a minute: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop asks the daemon to stop (it stops its containers) and waits, killing it after 60s.
func (d *dockerd) stop() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
		d.cmd = nil
		return errors.New("dockerd did not stop within 60s of SIGTERM and was killed")
	}
	d.cmd = nil
	return nil
}

// remove removes every container, network and image of the engine, stops it and unmounts
// whatever it left mounted under its folder.
func (d *dockerd) remove(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if d.cmd != nil {
		if list, err := d.engine.ContainerList(ctx, container.ListOptions{All: true}); err == nil {
			for _, c := range list {
				if err := d.engine.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
					t.Errorf("remove container %v: %v", c.Names, err)
				}
			}
		}
		if nets, err := d.engine.NetworkList(ctx, network.ListOptions{}); err == nil {
			for _, n := range nets {
				if n.Name != "host" && n.Name != "none" && n.Name != "bridge" {
					if err := d.engine.NetworkRemove(ctx, n.ID); err != nil {
						t.Errorf("remove network %s: %v", n.Name, err)
					}
				}
			}
		}
		if imgs, err := d.engine.ImageList(ctx, image.ListOptions{All: true}); err == nil {
			for _, i := range imgs {
				_, _ = d.engine.ImageRemove(ctx, i.ID, image.RemoveOptions{Force: true, PruneChildren: true})
			}
		}
	}
	if err := d.stop(); err != nil {
		t.Error(err)
	}
	d.engine.Close()
	unmountUnder(t, d.dir)
	// Nothing of the engine outlives it. A containerd shim can: one whose container the
	// daemon lost track of when it was stopped mid-run. Those are ended here.
	for _, p := range processesNaming(d.dir) {
		t.Logf("ending a process the suite's dockerd left: %s", p)
		if pid, err := strconv.Atoi(strings.SplitN(p, ":", 2)[0]); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := processesNaming(d.dir)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("processes of the suite's dockerd left after it stopped: %v", left)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	unmountUnder(t, d.dir)
}

// processesNaming are the command lines of the processes whose command line names dir.
func processesNaming(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(raw), dir) {
			out = append(out, e.Name()+": "+strings.TrimSpace(strings.ReplaceAll(string(raw), "\x00", " ")))
		}
	}
	return out
}

// unmountUnder unmounts every mount below dir, deepest first.
func unmountUnder(t testing.TB, dir string) {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Error(err)
		return
	}
	var points []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("unmount %s: %v", p, err)
		}
	}
}

// tmpfs mounts a tmpfs of size bytes at dir until the test ends.
func tmpfs(t testing.TB, dir string, size int64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		t.Fatalf("mount a tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// fill writes a file into dir until its file system is full and returns its path.
func fill(dir string) (string, int64, error) {
	path := filepath.Join(dir, ".fault-filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return path, 0, err
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(chunk)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return path, n, nil
		}
		if err != nil {
			return path, n, err
		}
	}
}

// proc is one of the product's processes, kept running by the suite as a service manager
// would: when it exits (killed by a fault, or stopping on its own, as a dispatcher that lost
// its instance's lease does) it is started again, until the suite stops it.
type proc struct {
	name    string
	argv    []string
	env     []string
	health  string // a URL answering 200 once it serves
	logPath string

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	stopping bool
	starts   int
	stopped  chan struct{}
}

// supervise starts p and keeps it running until stop.
func (p *proc) supervise(t testing.TB) {
	p.stopped = make(chan struct{})
	started := make(chan error, 1)
	go func() {
		defer close(p.stopped)
		first := true
		for {
			err := p.startOnce()
			if first {
				started <- err
				first = false
				if err != nil {
					return
				}
			}
			if errors.Is(err, errStopping) {
				return
			}
			if err == nil {
				<-p.exited
			}
			p.mu.Lock()
			stopping := p.stopping
			p.mu.Unlock()
			if stopping {
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	if err := <-started; err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
}

// errStopping is a start refused because the suite is stopping the process.
var errStopping = errors.New("stopping")

func (p *proc) startOnce() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		logf.Close()
		return errStopping
	}
	p.starts++
	fmt.Fprintf(logf, "=== start %d of %s at %s\n", p.starts, p.name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// Should the test process die (go test's -timeout runs no cleanup), so do they.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logf, "=== %s exited at %s: %v\n", p.name, time.Now().UTC().Format(time.RFC3339Nano), err)
		logf.Close()
		close(exited)
	}()
	return nil
}

// ready waits until p's health URL answers 200.
func (p *proc) ready(within time.Duration) error {
	deadline := time.Now().Add(within)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(p.health)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer %s within %s: %v", p.name, p.health, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// stop ends supervision: SIGTERM (and SIGCONT, should it be paused), then the exit within
// within; it reports an exit other than a clean one.
func (p *proc) stop(within time.Duration) error {
	if p.stopped == nil {
		return nil // never started
	}
	p.mu.Lock()
	p.stopping = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		<-p.stopped
		return nil
	}
	select {
	case <-exited:
		<-p.stopped
		return nil // it had exited (killed by a fault) and is not started again
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(within):
		_ = cmd.Process.Kill()
		<-exited
		<-p.stopped
		return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.name, within)
	}
	<-p.stopped
	if st := cmd.ProcessState; st != nil && !st.Success() {
		return fmt.Errorf("%s exited %v on SIGTERM", p.name, st)
	}
	return nil
}

// tail is the last n lines of p's log.
func (p *proc) tail(n int) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
