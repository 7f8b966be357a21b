package admin

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

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

// bodyBudget bounds the request bodies the admin API holds at once, by
// size. huma reads a body whole before decoding it, and with what decoding
// makes of it (ten times its size and more for many small fields) each
// large body in flight costs tens of MB: two hundred at once took the
// daemon to 4 GB. A body larger than maxSmallBody, or of unknown length to
// the route that reads a message (the others read at most maxSmallBody),
// takes its share (up to the largest document) before it is read, from
// four of the largest documents; a request that finds no room within
// bodyWait is answered 503 with Retry-After, its body unread. A client
// that sends its body slowly holds its share until the read timeout
// (readTimeout); the short bodies of the other routes pass beside.
type bodyBudget struct {
	sem  *semaphore.Weighted
	size int64 // the budget, bytes
	most int64 // the largest document: a share never exceeds it
	wait time.Duration
}

// bodyWait is how long a request waits for its share of the body budget.
const bodyWait = 5 * time.Second

func newBodyBudget(largest int64) *bodyBudget {
	largest = max(largest, maxSmallBody)
	return &bodyBudget{sem: semaphore.NewWeighted(4 * largest), size: 4 * largest, most: largest, wait: bodyWait}
}

// admit takes the share of r's body, or answers 503 and returns false. The
// caller runs release once it no longer holds the body.
func (b *bodyBudget) admit(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	n := r.ContentLength
	large := r.Method == opPostMessage.method && r.URL.Path == opPostMessage.path // the route that reads a large body
	if r.Body == nil || r.Body == http.NoBody || n == 0 || (n > 0 && n <= maxSmallBody) || (n < 0 && !large) {
		return func() {}, true
	}
	share := b.most
	if n > 0 {
		share = min(n, b.most) // a larger one is refused (413) as it is read
	}
	ctx, cancel := context.WithTimeout(r.Context(), b.wait)
	defer cancel()
	if err := b.sem.Acquire(ctx, share); err != nil {
		w.Header().Set("Retry-After", strconv.Itoa(int(b.wait.Seconds())))
		w.Header().Set("Connection", "close") // its body is not read
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf(
			"the admin API holds as many large request bodies as it takes at once (%d MiB in all); try again", b.size>>20))
		return nil, false
	}
	return func() { b.sem.Release(share) }, true
}
