package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestCancelAnswered204IsNeverPublished: cancels sent from 40 ms before to
// 10 ms after the due instant of 300 messages, with fire ahead on (the
// default): a message whose cancel was answered 204 is never published,
// one answered 409 (being published, with Retry-After) at most once, and
// one answered 404 was delivered before it: a cancel that meets a message
// in flight must not answer 204 while its publish goes on.
func TestCancelAnswered204IsNeverPublished(t *testing.T) {
	e := newNATSEnv(t, "", "")
	const n = 300
	due := time.Now().Add(2500 * time.Millisecond).Truncate(time.Millisecond)
	ids := e.parkAt("cancel", n, due)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.d.stats().Parked == n || time.Now().After(due) })

	codes := make([]int, n)
	retryAfter := make([]string, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		at := due.Add(-40*time.Millisecond + time.Duration(i)*50*time.Millisecond/n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-time.After(time.Until(at)) // the scenario's instant, not a synchronisation
			req, _ := http.NewRequest(http.MethodDelete, e.d.admin+"/v1/messages/"+id, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i], retryAfter[i] = resp.StatusCode, resp.Header.Get("Retry-After")
		}()
	}
	wg.Wait()
	// Everything that was going to be published has been once nothing is
	// parked: a 409 whose publish failed would be scheduled again.
	testenv.Eventually(t, 30*time.Second, func() bool { return e.d.stats().Parked == 0 }, "messages still parked")
	e.caughtUp()

	count := map[int]int{}
	for i, id := range ids {
		count[codes[i]]++
		copies := len(e.firedCopies(id))
		switch codes[i] {
		case http.StatusNoContent:
			if copies != 0 {
				t.Errorf("%s: cancel answered 204, published %d times", id, copies)
			}
		case http.StatusConflict:
			if copies > 1 || retryAfter[i] == "" {
				t.Errorf("%s: cancel answered 409 (Retry-After %q), published %d times", id, retryAfter[i], copies)
			}
		case http.StatusNotFound:
			if copies != 1 {
				t.Errorf("%s: cancel answered 404 (delivered), published %d times", id, copies)
			}
		default:
			t.Errorf("%s: cancel answered %d", id, codes[i])
		}
	}
	t.Logf("answers: %s", fmt.Sprint(count))
}
