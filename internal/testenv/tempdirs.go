package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Process-wide temp dirs (the shared RabbitMQ node's, Build's) are removed by Main.
// A test binary that dies first (go test -timeout, SIGKILL) leaves its dir behind, so
// each such dir records its owner's pid, and later test processes remove the dirs
// whose owner is gone.

const ownerFile = "testenv-owner.pid"

// mkProcessTempDir creates a temp dir named prefix* owned by this process, after
// removing stale ones with the same prefix.
func mkProcessTempDir(prefix string) (string, error) {
	removeStaleDirs(prefix)
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

func removeStaleDirs(prefix string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // not ours, or being created right now
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}
