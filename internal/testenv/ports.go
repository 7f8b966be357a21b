package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// Port ranges. Everything stays below the Linux ephemeral range (32768-60999 by
// default) so that a port is not taken by some outgoing connection while a server
// is down for a restart, and away from the system defaults of the servers.
const (
	portLo = 20000
	portHi = 32000

	// A Redis cluster node needs port p and its bus port p+10000: p is drawn from
	// [clusterLo, clusterHi), so the bus port is in [22000, 30000).
	clusterLo = 12000
	clusterHi = 20000
)

var (
	lockDirOnce sync.Once
	lockDir     string
	lockDirErr  error
)

// portLockDir is the directory of the per-port lock files shared by every test process
// on the machine. The files are never deleted (deleting a lock file races with another
// process locking it); they are empty and at most one per port.
func portLockDir() (string, error) {
	lockDirOnce.Do(func() {
		lockDir = filepath.Join(os.TempDir(), "delaybridge-testenv-ports")
		if lockDirErr = os.MkdirAll(lockDir, 0o777); lockDirErr == nil {
			_ = os.Chmod(lockDir, 0o777) // several users may share /tmp
		}
	})
	return lockDir, lockDirErr
}

// lockPort takes the exclusive, non-blocking flock of the port's lock file. The lock is
// held as long as the returned file is open, and dies with the process. flock locks
// belong to the open file description, so a second lockPort of the same port in the
// same process fails too.
func lockPort(port int) (*os.File, bool) {
	dir, err := portLockDir()
	if err != nil {
		return nil, false
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)+".lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}

// bindable reports whether 127.0.0.1:port can be listened on right now.
func bindable(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// tryReserve picks a random base port p in [lo, hi) such that p+off is lockable and
// bindable for every off in offsets (p itself is always included). On success the
// locks are held until release is called.
func tryReserve(lo, hi int, offsets ...int) (port int, release func(), err error) {
	offs := append([]int{0}, offsets...)
	for attempt := 0; attempt < 500; attempt++ {
		p := lo + rand.IntN(hi-lo)
		var held []*os.File
		ok := true
		for _, off := range offs {
			q := p + off
			if q <= 0 || q > 65535 {
				ok = false
				break
			}
			f, locked := lockPort(q)
			if !locked {
				ok = false
				break
			}
			held = append(held, f)
			if !bindable(q) {
				ok = false
				break
			}
		}
		if ok {
			var once sync.Once
			return p, func() {
				once.Do(func() {
					for _, f := range held {
						f.Close()
					}
				})
			}, nil
		}
		for _, f := range held {
			f.Close()
		}
	}
	return 0, nil, fmt.Errorf("testenv: no free port in [%d,%d) with offsets %v after 500 attempts", lo, hi, offsets)
}

// reservePorts is tryReserve for a test: it fails the test on error and releases the
// reservation in t.Cleanup.
func reservePorts(t testing.TB, lo, hi int, offsets ...int) int {
	t.Helper()
	p, release, err := tryReserve(lo, hi, offsets...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return p
}
