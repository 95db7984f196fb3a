package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// output runs a command and returns its trimmed standard output; on
// failure the error carries standard error.
func output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// runEnv runs a command with extra environment, streaming its output.
func runEnv(ctx context.Context, dir string, extraEnv []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// kubectl runs the cluster's kubectl as admin and returns its output.
func kubectl(ctx context.Context, e env, args ...string) (string, error) {
	return output(ctx, e.repo, e.bin("kubectl"), append([]string{"--kubeconfig", e.kubeconfig()}, args...)...)
}

func kubectlPassthrough(ctx context.Context, e env, args []string) error {
	cmd := exec.CommandContext(ctx, e.bin("kubectl"), append([]string{"--kubeconfig", e.kubeconfig()}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	return cmd.Run()
}

// start launches a long-running component in its own session, with its
// output in logs/NAME.log and its pid in pids/NAME, so that it outlives
// this command and down can stop exactly it.
func start(e env, name, bin string, args ...string) error {
	if err := os.MkdirAll(e.path("logs"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(e.path("pids"), 0o755); err != nil {
		return err
	}
	log, err := os.OpenFile(e.logFile(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = e.state
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(e.path("pids", name), []byte(strconv.Itoa(pid)+" "+bin), 0o644); err != nil {
		return err
	}
	// Reap it if it dies while this command still runs, so that alive()
	// does not see a zombie.
	go cmd.Wait()
	return nil
}

// alive reports whether the component NAME started by start still runs.
func alive(e env, name string) bool {
	pid, bin, err := readPid(e, name)
	return err == nil && pidRuns(pid, bin)
}

func readPid(e env, name string) (int, string, error) {
	b, err := os.ReadFile(e.path("pids", name))
	if err != nil {
		return 0, "", err
	}
	pidStr, bin, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	pid, err := strconv.Atoi(pidStr)
	return pid, bin, err
}

// pidRuns reports whether pid is a live (not zombie) process running bin,
// so that a recycled pid is never signalled.
func pidRuns(pid int, bin string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || strings.TrimSuffix(exe, " (deleted)") != bin {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

// stop sends SIGTERM to the component NAME, then SIGKILL after grace.
func stop(e env, name string, grace time.Duration) error {
	pid, bin, err := readPid(e, name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer os.Remove(e.path("pids", name))
	return killWait(pid, bin, grace)
}

func killWait(pid int, bin string, grace time.Duration) error {
	if !pidRuns(pid, bin) {
		return nil
	}
	syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !pidRuns(pid, bin) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50; i++ {
		if !pidRuns(pid, bin) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("pid %d (%s) survived SIGKILL", pid, filepath.Base(bin))
}

// waitFor polls f until it succeeds or timeout passes; the error names
// what was awaited and the last failure.
func waitFor(ctx context.Context, what string, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = f(); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not ready after %s: %w", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
