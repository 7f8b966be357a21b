package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestCeleryWorkerRunsDelayedTasks: a real Celery app (Debian's
// python3-celery, scripts/test-deps.sh) publishes tasks with x-delay to
// the queue delaybridge reads, as its users do with the delayed-message
// exchange, and a real Celery worker runs them from the queue delaybridge
// publishes to: each task once, not before its delay, in due order, with
// its ID and headers as Celery sent them; one given its task ID as its
// message ID is cancelled by it and never runs. Celery declares its
// queues again on every publish, so the queue delaybridge declared must
// be one Celery can declare too.
func TestCeleryWorkerRunsDelayedTasks(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	if _, err := exec.Command(debianPython, "-c", "import celery").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import celery (python3-celery comes with scripts/test-deps.sh): %v", debianPython, err)
	}
	rabbit := testenv.RabbitMQ(t)
	rs := testenv.Redis(t)
	ingestQ, workerQ := "celery-delays", "celery-work"
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: celery}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: celery
    rabbitmq: {url: %q, queue: %s}
    route: {sink: rabbit, destination: %s}
sinks:
  - name: rabbit
    rabbitmq: {url: %[2]q, exchange: ""}
`, rs.Addr, rabbit.URL, ingestQ, workerQ))
	t.Cleanup(d.stop)

	app, err := filepath.Abs("testdata/celery")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "runs.jsonl")
	env := []string{"DELAYAPP_BROKER=" + rabbit.URL, "DELAYAPP_WORKER_QUEUE=" + workerQ,
		"DELAYAPP_INGEST_QUEUE=" + ingestQ, "DELAYAPP_OUT=" + out, "PYTHONDONTWRITEBYTECODE=1"}
	worker := testenv.StartProcessWith(t, testenv.ProcessOptions{Env: env, Dir: app}, debianPython,
		"-m", "celery", "-A", "delayapp", "worker", "--pool", "solo", "--concurrency", "1",
		"--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO")
	testenv.Eventually(t, 60*time.Second, func() bool {
		if worker.Exited() {
			t.Fatalf("the Celery worker exited:\n%s", worker.Output())
		}
		return strings.Contains(worker.Output(), "ready.")
	}, "the Celery worker did not start:\n%s", worker.Output())

	// Published the later one first: the worker must run them in due order.
	// The last one, due well after, comes out of the worker's queue after
	// any second copy of the others that delaybridge had published.
	// "cancelled" is published with its task ID as its message ID and
	// cancelled by it at once: it never runs (it was due before the last).
	delays := map[string]time.Duration{"second": 3 * time.Second, "first": 1500 * time.Millisecond, "last": 6 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := exec.CommandContext(ctx, debianPython, "delayapp.py", "publish", "second", "3000", "first", "1500", "cancelled", "4000:id", "last", "6000")
	pub.Dir, pub.Env = app, append(os.Environ(), env...)
	ids, err := pub.Output()
	if err != nil {
		t.Fatalf("publish: %v %s", err, exitStderr(err))
	}
	sent := strings.Fields(string(ids))
	if len(sent) != 4 {
		t.Fatalf("publish printed %q, want four task IDs", ids)
	}
	if code, body := d.do(http.MethodDelete, "/v1/messages/"+sent[2], nil); code != http.StatusNoContent {
		t.Fatalf("cancel the task %s by its ID: %d %s", sent[2], code, body)
	}

	type run struct {
		ID      string         `json:"id"`
		Corr    string         `json:"correlation_id"`
		Who     string         `json:"who"`
		SentAt  float64        `json:"sent_at"`
		RanAt   float64        `json:"ran_at"`
		Retries int            `json:"retries"`
		Headers map[string]any `json:"headers"`
	}
	var runs []run
	read := func() []run {
		f, err := os.Open(out)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var rs []run
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r run
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("a run's line %q: %v", sc.Text(), err)
			}
			rs = append(rs, r)
		}
		return rs
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		runs = read()
		return len(runs) > 0 && runs[len(runs)-1].Who == "last"
	}, "the worker did not run the last task:\n%s", worker.Output())

	var order []string
	for _, r := range runs {
		order = append(order, r.Who)
	}
	if strings.Join(order, " ") != "first second last" {
		t.Errorf("ran %v, want each once in due order: first (1.5 s), second (3 s), last (6 s)", order)
	}
	byWho := map[string]string{"second": sent[0], "first": sent[1], "last": sent[3]}
	for _, r := range runs {
		if r.ID != byWho[r.Who] {
			t.Errorf("task %s ran with ID %s, Celery sent it as %s", r.Who, r.ID, byWho[r.Who])
		}
		// sent_at is taken before the publish: the due time is later.
		if early := time.Duration((r.SentAt-r.RanAt)*float64(time.Second)) + delays[r.Who]; early > 0 {
			t.Errorf("task %s ran %v before its delay of %v had passed", r.Who, early, delays[r.Who])
		}
		if r.Retries != 0 {
			t.Errorf("task %s: retries %d", r.Who, r.Retries)
		}
		if v, ok := r.Headers["x-delay"]; ok {
			t.Errorf("task %s still carries x-delay %v: a worker behind another delay stage would wait again", r.Who, v)
		}
		if r.Corr != r.ID {
			t.Errorf("task %s: correlation ID %q, want the task ID %s (Celery's results are matched on it)", r.Who, r.Corr, r.ID)
		}
		if id, _ := r.Headers["x-message-id"].(string); id == "" || r.Headers["x-delaybridge-attempt"] != "1" {
			t.Errorf("task %s: delaybridge's headers %v", r.Who, r.Headers)
		}
	}
	// delaybridge holds nothing more, and nothing died.
	testenv.Eventually(t, 30*time.Second, func() bool {
		var st struct{ Parked, Dead int }
		code, _ := d.get("/v1/stats", &st)
		return code == 200 && st.Parked == 0 && st.Dead == 0
	}, "delaybridge still holds messages")
}

// exitStderr is the standard error of a command that failed, if it kept it.
func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
