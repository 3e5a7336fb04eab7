package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/retryd/retryd/internal/freeaddr"
	"github.com/retryd/retryd/internal/wait"
)

// The recovery and memory scenarios run the real retryd-scheduler binary
// as a child process: kill -9 needs a process, and its RSS is only its
// own when it is one.

const schedulerPkg = "github.com/retryd/retryd/services/scheduler/cmd/retryd-scheduler"

var builtScheduler struct {
	once sync.Once
	path string
	err  error
}

// schedulerBinary returns --scheduler-bin, or builds the binary once per
// run with the go command (run from the repository, as CI does).
func schedulerBinary(ctx context.Context, env Env) (string, error) {
	if env.SchedulerBin != "" {
		return env.SchedulerBin, nil
	}
	builtScheduler.once.Do(func() {
		dir, err := os.MkdirTemp("", "retryd-bench-bin-")
		if err != nil {
			builtScheduler.err = err
			return
		}
		cleanupDirs.add(dir)
		out := filepath.Join(dir, "retryd-scheduler")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, schedulerPkg)
		if b, err := cmd.CombinedOutput(); err != nil {
			builtScheduler.err = fmt.Errorf("go build %s (run the bench from the repository, or pass --scheduler-bin): %w\n%s", schedulerPkg, err, b)
			return
		}
		builtScheduler.path = out
	})
	return builtScheduler.path, builtScheduler.err
}

// schedProc is one run of the scheduler binary.
type schedProc struct {
	cmd     *exec.Cmd
	logPath string
	addr    string
	started time.Time
	exited  chan struct{}
	waitErr error
}

func startSchedProc(bin, dbURL, natsURL, logDir string) (*schedProc, error) {
	addr, err := freeaddr.Loopback()
	if err != nil {
		return nil, err
	}
	logFile, err := os.CreateTemp(logDir, "retryd-scheduler-*.log")
	if err != nil {
		return nil, fmt.Errorf("create scheduler log: %w", err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+dbURL,
		"NATS_URL="+natsURL,
		"RETRYD_HTTP_ADDR="+addr,
		"RETRYD_MIGRATE=false",
		"RETRYD_LOG_LEVEL=warn",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	p := &schedProc{cmd: cmd, logPath: logFile.Name(), addr: addr, exited: make(chan struct{})}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	return p, nil
}

// waitReady polls /readyz until the scheduler answers 200.
func (p *schedProc) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("scheduler exited (%v); log %s:\n%s", p.waitErr, p.logPath, tailFile(p.logPath, 2000))
		default:
		}
		resp, err := client.Get("http://" + p.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("scheduler not ready after %s; log %s:\n%s", timeout, p.logPath, tailFile(p.logPath, 2000))
		}
		if err := wait.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// kill9 kills the process the hard way and waits for it.
func (p *schedProc) kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// stop asks for a graceful stop and kills after timeout.
func (p *schedProc) stop(timeout time.Duration) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.kill9()
	}
}

// rss is the resident set size (VmRSS) of the process in bytes.
func (p *schedProc) rss() (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("read scheduler status: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fields := strings.Fields(v)
			if len(fields) == 2 && fields[1] == "kB" {
				kb, err := strconv.ParseInt(fields[0], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("parse VmRSS: %w", err)
				}
				return kb * 1024, nil
			}
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

func tailFile(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}
