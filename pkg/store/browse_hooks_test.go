package store

// SetBrowseGroupIndexMax sets browseGroupIndexMax for a test and returns
// the func that restores it.
func SetBrowseGroupIndexMax(n int) (restore func()) {
	old := browseGroupIndexMax
	browseGroupIndexMax = n
	return func() { browseGroupIndexMax = old }
}
