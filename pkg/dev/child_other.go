//go:build !linux

package dev

import "os/exec"

// startChild starts cmd. Outside Linux there is no parent-death signal: a
// child outlives a dev killed with SIGKILL (a dev stopped any other way
// stops it).
func startChild(cmd *exec.Cmd) (wait func() error, err error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd.Wait, nil
}
