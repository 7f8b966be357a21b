package store

// SetBrowseGroupIndexMax sets browseGroupIndexMax for a test and returns
// the func that restores it.
func SetBrowseGroupIndexMax(n int) (restore func()) {
	old := browseGroupIndexMax
	browseGroupIndexMax = n
	return func() { browseGroupIndexMax = old }
}

// SetReslotBatch sets how many entries one reslot call looks at.
func SetReslotBatch(n int) (restore func()) {
	old := reslotBatch
	reslotBatch = n
	return func() { reslotBatch = old }
}

// SetReslotHook sets a func Reslot calls between two of its calls of a
// shard (nil: none).
func SetReslotHook(f func()) { reslotBetween = f }

// SetWalkEndingHook sets a func Reslot calls just before it ends its walk
// (nil: none).
func SetWalkEndingHook(f func()) { walkEnding = f }
