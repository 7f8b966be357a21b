package dev

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// startChild starts cmd so that it dies with this process, however this
// process ends (a SIGKILL too): Linux sends the child SIGTERM when the
// thread that forked it exits, so the fork happens on a goroutine locked to
// its thread, which stays locked (and alive) until the child has exited.
// wait is cmd.Wait.
func startChild(cmd *exec.Cmd) (wait func() error, err error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			runtime.UnlockOSThread()
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
		runtime.UnlockOSThread()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return sync.OnceValue(func() error { return <-exited }), nil
}
