package admin

import (
	"context"

	"golang.org/x/sync/semaphore"
)

// decodeBudget bounds the JSON the admin API decodes at once, by size:
// decoding costs memory linear in a document's size, but some 40 times it
// (encoding/json's tokens, the strict checks, the values), and a body of
// many small fields near the largest limit costs about 100 MB; forty at
// once took the daemon to 4 GB. The budget is two of the largest
// documents: large bodies take turns, small ones pass beside them. It
// is taken once the body is read, for the decoding alone, so that a client
// that sends its body slowly holds none of it.
type decodeBudget struct {
	sem  *semaphore.Weighted
	size int64 // the budget, bytes
	most int64 // the largest document: a share never exceeds it
}

func newDecodeBudget(largest int64) *decodeBudget {
	largest = max(largest, maxSmallBody)
	return &decodeBudget{sem: semaphore.NewWeighted(2 * largest), size: 2 * largest, most: largest}
}

// decode runs f, which decodes n bytes, once their share of the budget is
// free. A body of a few short fields (maxSmallBody at most, a few MB to
// decode) takes no share: it would wait behind large ones for nothing.
func (b *decodeBudget) decode(n int, f func() error) error {
	if n <= maxSmallBody {
		return f()
	}
	w := min(int64(n), b.most)
	if err := b.sem.Acquire(context.Background(), w); err != nil {
		return err // only with a context that ends
	}
	defer b.sem.Release(w)
	return f()
}
