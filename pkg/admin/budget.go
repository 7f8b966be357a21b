package admin

import (
	"context"
	"net/http"
	"time"

	"golang.org/x/sync/semaphore"
)

// bodyBudget bounds the request bodies the admin API reads and decodes at
// once, by their size: decoding a JSON document costs memory linear in its
// size, but some 40 times it (encoding/json's tokens, the strict checks,
// the values), and a body of many small fields near the largest limit
// costs about 100 MB; forty at once took the daemon to 4 GB. The budget is
// two of the largest documents: small bodies, the usual ones, pass side by
// side, large ones take turns, and a request that cannot have its share
// within bodyWait is answered 503 with Retry-After.
type bodyBudget struct {
	sem  *semaphore.Weighted
	size int64 // the budget, bytes
	most int64 // the largest document (the weight of a body of unknown size)
}

// bodyWait bounds how long a request waits for its share of the budget.
const bodyWait = 10 * time.Second

func newBodyBudget(largest int64) *bodyBudget {
	largest = max(largest, maxSmallBody)
	return &bodyBudget{sem: semaphore.NewWeighted(2 * largest), size: 2 * largest, most: largest}
}

// take waits for r's share of the budget, its declared size (the largest
// document when it declares none); it reports false when it answered 503
// instead. A request without a body takes nothing.
func (b *bodyBudget) take(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	n := r.ContentLength
	switch {
	case n == 0:
		return func() {}, true
	case n < 0 || n > b.most:
		n = b.most // unknown (chunked), or over every limit: its route refuses it past its own
	}
	ctx, cancel := context.WithTimeout(r.Context(), bodyWait)
	defer cancel()
	if err := b.sem.Acquire(ctx, n); err != nil {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "too many large request bodies are being read at once; retry")
		return nil, false
	}
	return func() { b.sem.Release(n) }, true
}
