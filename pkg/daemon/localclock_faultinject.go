//go:build faultinject

package daemon

import (
	"fmt"
	"os"
	"time"

	"github.com/delaybridge/delaybridge/pkg/scheduler"
)

// FaultClockSkewEnv names the environment variable that, in a binary built
// with the tag faultinject (the fault suite's, never a release), skews this
// process's own clock by a Go duration ("5m", "-5m"). Go reads the kernel's
// vDSO clock, so no outside tool (libfaketime) can skew it; this hook is how
// the suite runs a daemon whose clock is wrong.
const FaultClockSkewEnv = "DELAYBRIDGE_FAULT_CLOCK_SKEW"

// localClock is the wall clock plus the skew of FaultClockSkewEnv.
func localClock() (now func() time.Time, sched scheduler.Clock, skew time.Duration) {
	v := os.Getenv(FaultClockSkewEnv)
	if v == "" {
		return time.Now, scheduler.SystemClock{}, 0
	}
	skew, err := time.ParseDuration(v)
	if err != nil {
		// A test-only build: a typo must not pass as "no skew".
		panic(fmt.Sprintf("%s=%q: %v", FaultClockSkewEnv, v, err))
	}
	c := skewedClock{skew: skew}
	return c.Now, c, skew
}

// skewedClock is the wall clock off by skew; Add moves the monotonic
// reading too, so differences with unskewed readings show the skew.
type skewedClock struct {
	scheduler.SystemClock
	skew time.Duration
}

func (c skewedClock) Now() time.Time { return time.Now().Add(c.skew) }
