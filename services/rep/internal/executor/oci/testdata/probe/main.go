// Command probe runs inside the oci backend's test containers (a static binary, so the rootfs
// needs no shell or libc) and writes what it finds to $RESULT, or to stdout when RESULT is
// unset (run through exec):
//
//	probe exit N      exits with status N
//	probe hostname    the hostname
//	probe id          "uid gid"
//	probe nofile      "soft hard" of RLIMIT_NOFILE
//	probe ps          the pids it sees in /proc, one a line
//	probe sleep       sleeps until killed
//	probe say OUT ERR writes OUT to stdout and ERR to stderr, then sleeps until killed
//	probe serve PORT  accepts tcp connections on 127.0.0.1:PORT until killed
//	probe hog         allocates and touches memory until killed
//	probe forkbomb    forks until the kernel refuses: "forked N: error"
//	probe write PATH TEXT  writes TEXT to PATH, then "written"
//	probe cat PATH    the content of PATH
//	probe listen PORT listens on 0.0.0.0:PORT, says "listening" on stdout, accepts and
//	                  closes connections until its stdin ends
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe COMMAND")
	}
	switch os.Args[1] {
	case "exit":
		n, _ := strconv.Atoi(os.Args[2])
		os.Exit(n)
	case "hostname":
		h, err := os.Hostname()
		if err != nil {
			fail(err.Error())
		}
		result(h)
	case "id":
		result(fmt.Sprintf("%d %d", os.Getuid(), os.Getgid()))
	case "nofile":
		var r syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			fail(err.Error())
		}
		result(fmt.Sprintf("%d %d", r.Cur, r.Max))
	case "ps":
		entries, err := os.ReadDir("/proc")
		if err != nil {
			fail(err.Error())
		}
		var pids []string
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				pids = append(pids, e.Name())
			}
		}
		result(strings.Join(pids, "\n"))
	case "say":
		fmt.Println(os.Args[2])
		fmt.Fprintln(os.Stderr, os.Args[3])
		for {
			time.Sleep(time.Hour)
		}
	case "fill": // fill N: write N MiB to /tmp/fill, then sleep
		n, _ := strconv.Atoi(os.Args[2])
		f, err := os.Create("/tmp/fill")
		if err != nil {
			fail(err.Error())
		}
		chunk := make([]byte, 1<<20)
		for i := range chunk {
			chunk[i] = byte(i) | 1
		}
		for i := 0; i < n; i++ {
			if _, err := f.Write(chunk); err != nil {
				fail(err.Error())
			}
		}
		_ = f.Sync()
		for {
			time.Sleep(time.Hour)
		}
	case "tick": // a numbered line on stdout every 50ms
		for i := 0; ; i++ {
			fmt.Println("tick", i)
			time.Sleep(50 * time.Millisecond)
		}
	case "sleep":
		for {
			time.Sleep(time.Hour)
		}
	case "serve": // serve PORT [HOST]: accept and close connections on HOST:PORT (127.0.0.1)
		host := "127.0.0.1"
		if len(os.Args) > 3 {
			host = os.Args[3]
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, os.Args[2]))
		if err != nil {
			fail(err.Error())
		}
		for {
			conn, err := l.Accept()
			if err != nil {
				fail(err.Error())
			}
			_ = conn.Close()
		}
	case "hog":
		var chunks [][]byte
		for {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = byte(i)
			}
			chunks = append(chunks, b)
		}
	case "forkbomb":
		forkbomb()
	case "write":
		if err := os.WriteFile(os.Args[2], []byte(os.Args[3]), 0o600); err != nil {
			fail(err.Error())
		}
		result("written")
	case "link": // link TARGET NAME: make NAME a symbolic link to TARGET
		if err := os.Symlink(os.Args[2], os.Args[3]); err != nil {
			fail(err.Error())
		}
	case "cat":
		b, err := os.ReadFile(os.Args[2])
		if err != nil {
			fail(err.Error())
		}
		result(string(b))
	case "listen":
		l, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", os.Args[2]))
		if err != nil {
			fail(err.Error())
		}
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				_ = conn.Close()
			}
		}()
		fmt.Println("listening on", l.Addr())
		_, _ = io.Copy(io.Discard, os.Stdin)
	default:
		fail("unknown command " + os.Args[1])
	}
}

// forkbomb forks children that only pause, with raw system calls (a forked copy of a Go
// program may run nothing else), until fork fails, then kills and reaps them and reports.
func forkbomb() {
	n := 0
	var ferr syscall.Errno
	for n < 10000 {
		pid, _, errno := syscall.RawSyscall(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0)
		if errno != 0 {
			ferr = errno
			break
		}
		if pid == 0 {
			for {
				syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
			}
		}
		n++
	}
	// As the namespace's init, kill(-1) reaches every other process in it.
	syscall.RawSyscall(syscall.SYS_KILL, ^uintptr(0), uintptr(syscall.SIGKILL), 0)
	for {
		_, _, errno := syscall.RawSyscall6(syscall.SYS_WAIT4, ^uintptr(0), 0, 0, 0, 0, 0)
		if errno != 0 {
			break
		}
	}
	result(fmt.Sprintf("forked %d: %v", n, ferr))
}

func result(s string) {
	if os.Getenv("RESULT") == "" {
		fmt.Println(s)
		return
	}
	if err := os.WriteFile(os.Getenv("RESULT"), []byte(s), 0o644); err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(1)
}
