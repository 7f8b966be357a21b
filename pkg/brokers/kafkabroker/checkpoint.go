package kafkabroker

import "sort"

// checkpointer tracks the records of one partition that were fetched and are
// not yet finished, and knows the offset that is safe to commit: the lowest
// offset not yet finished, or the offset after the last fetched record when
// every record is finished (Bento's checkpointer). Committing it means a
// crash re-reads from the first unfinished record and never skips one.
//
// Records are added in increasing offset order (offsets may have gaps:
// compaction, transaction markers) and may finish in any order. It is not
// safe for concurrent use; partition guards it.
type checkpointer struct {
	offs []int64 // fetched offsets from the lowest unfinished one, increasing
	done []bool  // done[i]: offs[i] finished
	next int64   // offset after the last fetched record (the start at first)
}

func newCheckpointer(start int64) *checkpointer {
	return &checkpointer{next: start}
}

// add registers a fetched record.
func (c *checkpointer) add(off int64) {
	c.offs = append(c.offs, off)
	c.done = append(c.done, false)
	c.next = off + 1
}

// finish marks off as finished. It reports false for an offset it does not
// track (already finished, or never added).
func (c *checkpointer) finish(off int64) bool {
	i := sort.Search(len(c.offs), func(i int) bool { return c.offs[i] >= off })
	if i == len(c.offs) || c.offs[i] != off || c.done[i] {
		return false
	}
	c.done[i] = true
	n := 0
	for n < len(c.done) && c.done[n] {
		n++
	}
	if n > 0 {
		// Re-slicing keeps the backing array; append reallocates (and
		// copies only the live tail) once its capacity is used up.
		c.offs, c.done = c.offs[n:], c.done[n:]
	}
	return true
}

// committable is the offset to commit: every record below it is finished.
func (c *checkpointer) committable() int64 {
	if len(c.offs) > 0 {
		return c.offs[0]
	}
	return c.next
}

// pending is the number of records from the lowest unfinished one on.
func (c *checkpointer) pending() int { return len(c.offs) }
