// Package conformance holds what the ingest and sink conformance suites
// (internal/ingesttest, internal/sinktest) share: fresh names per
// subtest, polling with a deadline, and header comparison.
package conformance

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// RandomHex returns n random bytes in hex: a run ID, so that names never
// collide across runs on one broker.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var nonKey = regexp.MustCompile(`[^a-z0-9]+`)

// Key returns a broker-safe name for the current subtest: prefix, run, the
// subtest's last name element (at most 40 characters) and seq.
func Key(t *testing.T, prefix, run string, seq int64) string {
	name := strings.ToLower(t.Name())
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	name = strings.Trim(nonKey.ReplaceAllString(name, "-"), "-")
	if len(name) > 40 {
		name = name[:40]
	}
	return prefix + "-" + run + "-" + name + "-" + strconv.FormatInt(seq, 10)
}

// Abbrev lists IDs for a failure message, at most 20.
func Abbrev(ids []string) string {
	if len(ids) > 20 {
		return strings.Join(ids[:20], ",") + fmt.Sprintf(",... (%d more)", len(ids)-20)
	}
	return strings.Join(ids, ",")
}

// HeaderValues groups headers by their exact key, keeping the order of the
// values of one key. Brokers with map headers (NATS, AMQP) keep no order
// across keys.
func HeaderValues(h envelope.Headers) map[string][]string {
	out := map[string][]string{}
	for _, kv := range h {
		out[kv.Key] = append(out[kv.Key], kv.Value)
	}
	return out
}

// DiffHeaders describes how got differs from want, comparing the values of
// each exact key in order, ignoring the keys in ignore; "" when equal.
func DiffHeaders(want, got envelope.Headers, ignore ...string) string {
	w, g := HeaderValues(want), HeaderValues(got)
	for _, k := range ignore {
		delete(w, k)
		delete(g, k)
	}
	keys := map[string]bool{}
	for k := range w {
		keys[k] = true
	}
	for k := range g {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var d []string
	for _, k := range sorted {
		wv, wok := w[k]
		gv, gok := g[k]
		switch {
		case !gok:
			d = append(d, fmt.Sprintf("missing %q: %q", k, wv))
		case !wok:
			d = append(d, fmt.Sprintf("unexpected %q: %q", k, gv))
		case !slices.Equal(wv, gv):
			d = append(d, fmt.Sprintf("%q is %q, want %q", k, gv, wv))
		}
	}
	return strings.Join(d, "; ")
}
