package rabbitbroker

import (
	"fmt"
	"testing"
	"time"
)

// TestLanesAreBoundedAndLeftWhenIdle: maxLanes destinations get a lane of
// their own, the next none (it shares the one more), and a lane unused for
// laneIdle is closed and forgotten when a lane is asked for, making room.
func TestLanesAreBoundedAndLeftWhenIdle(t *testing.T) {
	var s Sink
	now := time.Now()
	lanes := map[*lane]bool{}
	for i := range maxLanes {
		l := s.lane(fmt.Sprint("d", i), now)
		if l == nil || lanes[l] {
			t.Fatalf("destination %d: lane %p, a lane of its own wanted", i, l)
		}
		lanes[l] = true
	}
	if l := s.lane("d0", now); !lanes[l] {
		t.Fatal("a destination's lane changed")
	}
	if l := s.lane("one more", now); l != nil {
		t.Fatalf("lane %d given", maxLanes+1)
	}
	later := now.Add(laneIdle + time.Second)
	s.lane("d0", now.Add(laneIdle)) // used since: kept
	if l := s.lane("one more", later); l == nil {
		t.Fatal("no lane once the others were idle")
	}
	s.lanes.mu.Lock()
	defer s.lanes.mu.Unlock()
	if len(s.lanes.by) != 2 || s.lanes.by["d0"] == nil {
		t.Errorf("lanes after the idle ones were left: %v (want d0 and one more)", s.lanes.by)
	}
}
