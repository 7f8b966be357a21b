package scheduler

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Go's timers wake a goroutine through the runtime's network poller, whose
// epoll_wait takes whole milliseconds: a sleep ends up to a millisecond
// late, about half of one on average, whatever its length. A timerfd with
// the same poller ends when the kernel's timer fires, microseconds late on
// an idle machine, without a thread blocked in a system call and without
// spinning. SystemClock's timers are timerfds, reused from a pool; where
// one cannot be made (a sandbox refusing timerfd_create), Go's timer.

// fdTimer is one timerfd and the goroutine that reads it.
type fdTimer struct {
	fd int
	f  *os.File
	c  chan time.Time // cap 1: a fire not taken is dropped
}

var fdTimers = struct {
	sync.Mutex
	free   []*fdTimer
	failed bool // timerfd_create failed once: Go's timers from then on
}{}

// newPreciseTimer returns a timer that fires after d, or nil when no
// timerfd can be made.
func newPreciseTimer(d time.Duration) Timer {
	t := takeFDTimer()
	if t == nil {
		return nil
	}
	select { // a fire of its last use that nobody took
	case <-t.c:
	default:
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(int64(d), 1))}
	if err := unix.TimerfdSettime(t.fd, 0, &spec, nil); err != nil {
		t.f.Close()
		return nil
	}
	return &preciseTimer{t: t}
}

func takeFDTimer() *fdTimer {
	fdTimers.Lock()
	if n := len(fdTimers.free); n > 0 {
		t := fdTimers.free[n-1]
		fdTimers.free = fdTimers.free[:n-1]
		fdTimers.Unlock()
		return t
	}
	failed := fdTimers.failed
	fdTimers.Unlock()
	if failed {
		return nil
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		fdTimers.Lock()
		fdTimers.failed = true
		fdTimers.Unlock()
		return nil
	}
	t := &fdTimer{fd: fd, f: os.NewFile(uintptr(fd), "timerfd"), c: make(chan time.Time, 1)}
	go t.read()
	return t
}

// read passes each expiry of the timerfd to c, until the file is closed.
func (t *fdTimer) read() {
	var buf [8]byte
	for {
		if _, err := t.f.Read(buf[:]); err != nil {
			return
		}
		select {
		case t.c <- time.Now():
		default:
		}
	}
}

// preciseTimer is a Timer on a pooled fdTimer.
type preciseTimer struct {
	mu sync.Mutex
	t  *fdTimer // nil once stopped
}

// C is the timer's channel; nil (never ready) once stopped.
func (p *preciseTimer) C() <-chan time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.t == nil {
		return nil
	}
	return p.t.c
}

// Stop disarms the timerfd and returns it to the pool. A fire that raced
// with Stop may reach the next user of the timerfd, which then wakes once
// early: the scheduler looks at the time again after every wake-up.
func (p *preciseTimer) Stop() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.t == nil {
		return false
	}
	t := p.t
	p.t = nil
	var old unix.ItimerSpec
	if err := unix.TimerfdSettime(t.fd, 0, &unix.ItimerSpec{}, &old); err != nil {
		t.f.Close()
		return false
	}
	fdTimers.Lock()
	fdTimers.free = append(fdTimers.free, t)
	fdTimers.Unlock()
	return old.Value.Nano() > 0
}
