// Package supervise keeps child processes (the engines `smg serve` starts)
// running: each one's output is copied line by line behind a prefix, an exit
// is followed by a restart after a growing backoff, and a stop sends SIGTERM
// to the child's process group, then SIGKILL after a grace period. It knows
// nothing about engines or the gateway.
package supervise

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/smg-project/smg/internal/backoff"
)

// Process is one supervised child.
type Process struct {
	Name string   // log prefix and log attribute
	Path string   // executable
	Args []string // arguments after the executable
	Env  []string // extra KEY=VALUE entries on top of this process's environment
	// Output receives the child's stdout and stderr, one "[Name] line" per
	// line, in whole-line writes; several processes may share one SyncWriter.
	Output io.Writer
	// StopGrace is how long the child has after SIGTERM before SIGKILL.
	StopGrace time.Duration
	// Restart is the wait between an exit and the next start; it grows with
	// every exit that came sooner than StableAfter after its start.
	Restart backoff.Policy
	// StableAfter resets the restart backoff: a child that ran this long
	// before it exited is restarted after Restart.Initial again.
	StableAfter time.Duration
	// Started, when set, is told the pid of every start (tests, logs).
	Started func(pid int)
}

// Run starts p and restarts it whenever it exits, until ctx ends; then it
// stops the running child (SIGTERM to its process group, SIGKILL after
// StopGrace) and returns once it is gone. A child that cannot be started at
// all (missing executable, no permission) ends Run with that error.
func (p *Process) Run(ctx context.Context, log *slog.Logger) error {
	policy := p.Restart.WithDefaults()
	if err := policy.Validate(); err != nil {
		return err
	}
	wait := backoff.New(policy, nil)
	for {
		cmd, done, err := p.start()
		if err != nil {
			return fmt.Errorf("%s: %w", p.Name, err)
		}
		started := time.Now()
		if p.Started != nil {
			p.Started(cmd.Process.Pid)
		}
		log.Info("Engine started", "engine", p.Name, "pid", cmd.Process.Pid)
		select {
		case <-ctx.Done():
			p.stop(cmd, done, log)
			return nil
		case err := <-done:
			if time.Since(started) >= p.StableAfter {
				wait.Reset()
			}
			d := wait.Next()
			log.Warn("Engine exited; restarting", "engine", p.Name, "pid", cmd.Process.Pid, "exit", exitText(err), "restart_in", d.Round(time.Millisecond))
			if !backoff.Sleep(ctx, d) {
				return nil
			}
		}
	}
}

// start runs the child in a process group of its own, so that a stop reaches
// the processes it forks (Python engines start workers). done receives
// cmd.Wait's result once the child and its output copies are finished.
func (p *Process) start() (*exec.Cmd, <-chan error, error) {
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(cmd.Environ(), p.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	var copies sync.WaitGroup
	out := p.Output
	for _, r := range []io.Reader{stdout, stderr} {
		copies.Add(1)
		go func() {
			defer copies.Done()
			prefixLines(out, "["+p.Name+"] ", r)
		}()
	}
	done := make(chan error, 1)
	go func() {
		copies.Wait() // Wait closes the pipes: read them to the end first
		done <- cmd.Wait()
	}()
	return cmd, done, nil
}

func (p *Process) stop(cmd *exec.Cmd, done <-chan error, log *slog.Logger) {
	pgid := -cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-done:
		log.Info("Engine stopped", "engine", p.Name, "pid", cmd.Process.Pid)
		return
	case <-time.After(p.StopGrace):
	}
	log.Warn("Engine did not stop within its grace; killing it", "engine", p.Name, "pid", cmd.Process.Pid, "grace", p.StopGrace)
	_ = syscall.Kill(pgid, syscall.SIGKILL)
	<-done
}

func exitText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ProcessState.String()
	}
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// prefixLines copies r to w line by line, each line behind prefix. A line
// longer than the scanner's buffer is cut into pieces, never dropped whole.
func prefixLines(w io.Writer, prefix string, r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if line[len(line)-1] != '\n' {
				line = append(line, '\n')
			}
			_, _ = w.Write(append([]byte(prefix), line...))
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// SyncWriter serialises whole-line writes of several children's pipes onto
// one writer, so no line is cut into another.
type SyncWriter struct {
	mu sync.Mutex
	W  io.Writer
}

func (l *SyncWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.W.Write(b)
}
