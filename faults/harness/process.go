package harness

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Process is one service process. It runs in its own process group, so a
// signal reaches it and nothing else, and its stdout and stderr go to a
// log file that survives restarts (each start appends).
type Process struct {
	Name    string
	Bin     string
	Args    []string
	Env     []string
	LogPath string
	// Wrapper, when set, runs the binary under another program (e.g.
	// faketime): Wrapper[0] Wrapper[1:]... Bin Args...
	Wrapper []string
	// ReadyURL is polled by WaitReady (a /readyz endpoint); empty means
	// ready once started.
	ReadyURL string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	exitErr error
	starts  int
}

// Start starts the process. It fails if it is already running.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("start %s: already running (pid %d)", p.Name, p.cmd.Process.Pid)
		}
	}
	if err := os.MkdirAll(filepath.Dir(p.LogPath), 0o755); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	logFile, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: open log: %w", p.Name, err)
	}
	p.starts++
	fmt.Fprintf(logFile, "=== faults: start %d of %s at %s\n", p.starts, p.Name, time.Now().Format(time.RFC3339Nano))
	argv := append(append(append([]string(nil), p.Wrapper...), p.Bin), p.Args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd = cmd
	done := make(chan struct{})
	p.done = done
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Running reports whether the process runs (it may be stopped by SIGSTOP).
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("signal %s: not started", p.Name)
	}
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s %s: %w", sig, p.Name, err)
	}
	return nil
}

// Kill9 sends SIGKILL to the process group and waits for the exit.
func (p *Process) Kill9() error {
	if !p.Running() {
		return nil
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	_, err := p.Wait(30 * time.Second)
	return err
}

// Freeze sends SIGSTOP: the process stays alive, holds its connections,
// locks and leases, and does nothing.
func (p *Process) Freeze() error { return p.Signal(syscall.SIGSTOP) }

// Thaw sends SIGCONT.
func (p *Process) Thaw() error { return p.Signal(syscall.SIGCONT) }

// Term sends SIGTERM and waits up to timeout for a graceful exit; it
// returns the exit error (nil for exit status 0).
func (p *Process) Term(timeout time.Duration) error {
	if !p.Running() {
		return nil
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	exitErr, err := p.Wait(timeout)
	if err != nil {
		_ = p.Kill9()
		return err
	}
	return exitErr
}

// Wait waits for the process to exit and returns its exit error; the
// second error reports a timeout.
func (p *Process) Wait(timeout time.Duration) (exitErr, err error) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil, nil
	}
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.exitErr, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("%s did not exit within %s", p.Name, timeout)
	}
}

// WaitReady polls ReadyURL until it answers 200, the process exits or ctx
// ends.
func (p *Process) WaitReady(ctx context.Context) error {
	if p.ReadyURL == "" {
		return nil
	}
	client := &http.Client{Timeout: time.Second}
	for {
		if !p.Running() {
			return fmt.Errorf("%s exited before it was ready (log %s):\n%s", p.Name, p.LogPath, Tail(p.LogPath, 3000))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.ReadyURL, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w (log %s):\n%s", p.Name, p.ReadyURL, ctx.Err(), p.LogPath, Tail(p.LogPath, 3000))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// StartReady starts the process and waits until it is ready.
func (p *Process) StartReady(ctx context.Context) error {
	if err := p.Start(); err != nil {
		return err
	}
	return p.WaitReady(ctx)
}

// Tail returns the last n bytes of a file.
func Tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log)"
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "(no log)"
	}
	off := max(fi.Size()-n, 0)
	buf := make([]byte, fi.Size()-off)
	_, _ = f.ReadAt(buf, off)
	return string(buf)
}
