package ops

import (
	"reflect"
	"testing"
)

// The extraction the other tests rely on: every selector's metric (also inside
// functions, binary operations, matrix and subqueries, and written as __name__),
// the labels it matches on, and the grouping labels with the metrics under them.
func TestParseQuery(t *testing.T) {
	u, err := parseQuery(`histogram_quantile(0.99, sum by (sink, le) (rate(a_bucket{job=~"$job", sink!="x"}[$__rate_interval])))
		/ ignoring (limit) group_right max_over_time({__name__="b", limit="m"}[5m:1m]) > bool 0 or absent(up{job="d"}) unless count without (x) (c)`)
	if err != nil {
		t.Fatal(err)
	}
	want := []selectorUse{
		{metric: "a_bucket", labels: []string{"job", "sink"}},
		{metric: "b", labels: []string{"limit"}},
		{metric: "up", labels: []string{"job"}},
		{metric: "c"},
	}
	if !reflect.DeepEqual(u.selectors, want) {
		t.Errorf("selectors = %+v, want %+v", u.selectors, want)
	}
	wantGroups := []groupingUse{{labels: []string{"sink", "le"}, metrics: []string{"a_bucket"}}}
	if !reflect.DeepEqual(u.grouping, wantGroups) {
		t.Errorf("grouping = %+v, want %+v", u.grouping, wantGroups)
	}
	if got := metricNames([]queryUse{u}); !reflect.DeepEqual(got, []string{"a_bucket", "b", "c", "up"}) {
		t.Errorf("metricNames = %v", got)
	}
	for _, bad := range []string{`sum(rate(x[5m])`, `rate(x{job=~"$nope"}[5m])`} {
		if _, err := parseQuery(bad); err == nil {
			t.Errorf("parseQuery(%q) accepted it", bad)
		}
	}
}
