// Command testagent is the runtime tests' stand-in for hermes-host inside an org's worker or
// dashboard: a static binary that a FROM scratch image can hold, with one subcommand per
// behaviour the tests need to observe from inside a container or a local process.
//
//	idle                 block until SIGTERM or SIGINT (a worker's long-lived main process)
//	echo                 copy stdin to stdout line by line, then write a line to stderr and
//	                     exit with the code in TESTAGENT_EXIT (0 when unset)
//	sleep DURATION [TAG] sleep; TAG only marks the process so tests can look for it
//	tree TAG             start a child "sleep 1h TAG", print its pid, then sleep 1h too
//	hop TAG              start a detached "hop TAG" and exit: a chain of short-lived
//	                     generations, each a new pid, until killed
//	env                  print the environment, then /proc/self/cmdline
//	cmdlines             print the command line of every process visible in /proc
//	alloc MIB            allocate and touch MIB mebibytes, say so, then wait for stdin to end
//	ls PATH              list a directory
//	cat PATH             print a file
//	write PATH           write stdin to a file
//	dashboard ADDR       read KEY=VALUE lines from stdin until EOF, dial ADDR and send one
//	                     "KEY sha256(VALUE)" line each, then block like idle
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"hermeshost/internal/procsweep"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: testagent SUBCOMMAND [ARGS]"))
	}
	args := os.Args[2:]
	var err error
	switch os.Args[1] {
	case "idle":
		waitForTermination()
	case "echo":
		err = echo()
	case "sleep":
		err = sleep(args)
	case "tree":
		err = tree(args)
	case "env":
		err = printEnv()
	case "id":
		// The uid:gid it runs as, as the unit's execs see it.
		fmt.Printf("%d:%d\n", os.Getuid(), os.Getgid())
	case "cmdlines":
		err = cmdlines()
	case "alloc":
		err = alloc(args)
	case "ls":
		err = list(args)
	case "cat":
		err = cat(args)
	case "write":
		err = write(args)
	case "dashboard":
		err = dashboard(args)
	case "sweep":
		// What hermes-host worker sweep does, beside testagent idle.
		var res procsweep.Result
		res, err = procsweep.Sweep(5*time.Second, "testagent idle")
		fmt.Printf("swept %d\n", res.Killed)
	case "detach":
		err = detach(args)
	case "hop":
		err = hop(args)
	case "dial":
		// dial NETWORK ADDR...: one line per address, what a connection to it did.
		for _, addr := range args[1:] {
			c, derr := net.DialTimeout(args[0], addr, 2*time.Second)
			if derr != nil {
				fmt.Printf("%s: refused\n", addr)
				continue
			}
			c.Close()
			fmt.Printf("%s: connected\n", addr)
		}
	case "child":
		// Run the rest as a child and fail, with exit 3, when it does: a worker whose
		// agent died.
		child := exec.Command(os.Args[0], args...)
		child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
		if child.Run() != nil {
			os.Exit(3)
		}
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "testagent:", err)
	os.Exit(1)
}

func waitForTermination() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}

func echo() error {
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadString('\n')
		if _, werr := io.WriteString(os.Stdout, line); werr != nil {
			return werr
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	fmt.Fprintln(os.Stderr, "testagent: echo done")
	code := 0
	if v := os.Getenv("TESTAGENT_EXIT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("TESTAGENT_EXIT: %w", err)
		}
		code = n
	}
	os.Exit(code)
	return nil
}

func sleep(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("usage: sleep DURATION [TAG]")
	}
	d, err := time.ParseDuration(args[0])
	if err != nil {
		return err
	}
	time.Sleep(d)
	return nil
}

func tree(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: tree TAG")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, "sleep", "1h", args[0])
	if err := child.Start(); err != nil {
		return err
	}
	fmt.Println(child.Process.Pid)
	time.Sleep(time.Hour)
	return nil
}

func printEnv() error {
	for _, kv := range os.Environ() {
		fmt.Println(kv)
	}
	cmdline, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		return err
	}
	fmt.Println(strings.ReplaceAll(string(cmdline), "\x00", " "))
	return nil
}

func cmdlines() error {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return err
	}
	for _, dir := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue // the process ended while we listed
		}
		fmt.Printf("%s %s\n", filepath.Base(dir), strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return nil
}

func alloc(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: alloc MIB")
	}
	mib, err := strconv.Atoi(args[0])
	if err != nil {
		return err
	}
	chunks := make([][]byte, 0, mib)
	for range mib {
		chunk := make([]byte, 1<<20)
		for i := range chunk {
			chunk[i] = 1 // touch every byte so the pages are resident
		}
		chunks = append(chunks, chunk)
	}
	fmt.Printf("allocated %d MiB\n", len(chunks))
	_, err = io.Copy(io.Discard, os.Stdin)
	return err
}

func list(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: ls PATH")
	}
	entries, err := os.ReadDir(args[0])
	if err != nil {
		return err
	}
	for _, e := range entries {
		fmt.Println(e.Name())
	}
	return nil
}

func cat(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: cat PATH")
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(os.Stdout, f)
	return err
}

func write(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: write PATH")
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	return os.WriteFile(args[0], data, 0o600)
}

func dashboard(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: dashboard ADDR")
	}
	var report strings.Builder
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		key, value, ok := strings.Cut(in.Text(), "=")
		if !ok {
			return fmt.Errorf("secret line without '='")
		}
		sum := sha256.Sum256([]byte(value))
		fmt.Fprintf(&report, "%s %s\n", key, hex.EncodeToString(sum[:]))
	}
	if err := in.Err(); err != nil {
		return err
	}
	conn, err := net.Dial("tcp", args[0])
	if err != nil {
		return err
	}
	if _, err := io.WriteString(conn, report.String()); err != nil {
		return err
	}
	if err := conn.Close(); err != nil {
		return err
	}
	waitForTermination()
	return nil
}

// detach starts `testagent sleep 1h TAG` in a session of its own, as `setsid nohup ... &`
// does, prints its pid and exits at once, leaving it behind; with "hold" the child keeps
// this program's stdout and stderr open (`setsid cmd &` without nohup's redirection).
// hop starts its next generation in a session of its own, then exits: the chain never
// holds one pid for longer than a start of this program takes.
func hop(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: hop TAG")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	next := exec.Command(self, "hop", args[0])
	next.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return next.Start()
}

func detach(args []string) error {
	if len(args) != 1 && (len(args) != 2 || args[1] != "hold") {
		return fmt.Errorf("usage: detach TAG [hold]")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, "sleep", "1h", args[0])
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if len(args) == 2 {
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
	}
	if err := child.Start(); err != nil {
		return err
	}
	fmt.Println(child.Process.Pid)
	return nil
}
