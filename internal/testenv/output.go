package testenv

import (
	"bytes"
	"sync"
)

// Output is a bytes.Buffer that a logger (or a printer) writes while a
// test reads it: safe for concurrent use.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String returns what was written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
