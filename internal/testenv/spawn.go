package testenv

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Child processes get a parent-death signal (Pdeathsig) so that they do not outlive the
// test binary when it dies without running its cleanups (go test -timeout, a panic,
// SIGKILL). Linux sends that signal when the *thread* that forked the child exits, and
// the Go runtime may retire threads, so every child is forked from one goroutine locked
// to its OS thread for the life of the process.

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

// startChild starts cmd in its own process group with the given parent-death signal.
// cmd.SysProcAttr is replaced.
func startChild(cmd *exec.Cmd, deathSig syscall.Signal) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the process
			for req := range spawnCh {
				req.done <- req.cmd.Start()
			}
		}()
	})
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	done := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// killGroup sends sig to the process group led by pid (children started by startChild
// lead their own group). Errors (group already gone) are ignored.
func killGroup(pid int, sig syscall.Signal) {
	if pid > 0 {
		_ = syscall.Kill(-pid, sig)
	}
}
