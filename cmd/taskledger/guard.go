package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// guardEnv, set in its environment, makes this binary the guard of one
// --exec command instead of the CLI: its value is the command.
const guardEnv = "TASKLEDGER_EXEC_GUARD"

// guardChild runs the guard and exits in a process the worker started to
// run one command (startGuarded); elsewhere it returns at once. Call it
// first thing in main.
//
// The guard leads the command's process group. The worker has the kernel
// send it SIGTERM when the worker dies (even by kill -9), and it watches
// its parent besides (should the worker have died before that was set
// up); either way, and on SIGTERM, SIGINT or SIGHUP from anyone, it kills
// the whole group, itself included, so nothing the command started
// outlives the worker. Otherwise it waits for the shell and exits with
// its status (128 + the signal for a shell killed by one).
func guardChild() {
	command, ok := os.LookupEnv(guardEnv)
	if !ok {
		return
	}
	os.Unsetenv(guardEnv)
	parent := os.Getppid()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "taskledger exec guard:", err)
		os.Exit(127)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	orphaned := time.NewTicker(200 * time.Millisecond)
	for {
		select {
		case <-exited:
			code := cmd.ProcessState.ExitCode()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			os.Exit(code)
		case <-sigs:
			killGroup()
		case <-orphaned.C:
			if os.Getppid() != parent {
				killGroup()
			}
		}
	}
}

// killGroup kills the guard's process group, the guard with it.
func killGroup() {
	syscall.Kill(-os.Getpid(), syscall.SIGKILL)
	os.Exit(137) // not reached
}

// startGuarded starts cmd, a command made with guarded, in a process
// group of its own whose leader dies with the calling process. Wait for
// it with waitGuarded on the same goroutine: the kernel's parent-death
// signal follows the thread that started the child, so the thread stays
// locked to this goroutine until then.
func startGuarded(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	return nil
}

// waitGuarded waits for cmd, started by startGuarded on this goroutine.
func waitGuarded(cmd *exec.Cmd) error {
	defer runtime.UnlockOSThread()
	return cmd.Wait()
}

// guarded returns the command that runs command under a guard of this
// binary (guardChild), with env added to its environment and ctx's end
// killing the guard's whole group.
func guarded(ctx context.Context, command string, env ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(append(os.Environ(), env...), guardEnv+"="+command)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd, nil
}
