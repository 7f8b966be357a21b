package ops

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// A query's use of metrics, as the PromQL parser sees it.
type queryUse struct {
	// selectors are the series selectors, with the label names they match on.
	selectors []selectorUse
	// grouping are the labels of each `by (...)` clause, with the metrics
	// aggregated under it: each label must exist on one of them.
	grouping []groupingUse
}

type selectorUse struct {
	metric string   // as written: a histogram's series end in _bucket, _sum, _count
	labels []string // label names of the matchers, without __name__
}

type groupingUse struct {
	labels  []string
	metrics []string
}

// grafanaVars are the dashboard's variables with a value that keeps the query valid
// PromQL: interval variables become a duration, the others sit inside label
// matcher strings.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "${__rate_interval}", "5m",
	"$__interval", "1m", "${__interval}", "1m",
	"$__range", "1h", "${__range}", "1h",
	"${datasource}", "x", "$datasource", "x",
	"${job}", ".*", "$job", ".*",
	"${instance}", ".*", "$instance", ".*",
)

// parseQuery parses a PromQL expression (after substituting Grafana's variables)
// with Prometheus's own parser and returns what it selects and groups by.
func parseQuery(expr string) (queryUse, error) {
	expr = grafanaVars.Replace(expr)
	if strings.Contains(expr, "$") {
		return queryUse{}, fmt.Errorf("unknown Grafana variable in %q (add it to grafanaVars)", expr)
	}
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return queryUse{}, err
	}
	var u queryUse
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			u.selectors = append(u.selectors, selectorOf(n))
		case *parser.AggregateExpr:
			if n.Without || len(n.Grouping) == 0 {
				return nil
			}
			g := groupingUse{labels: n.Grouping}
			parser.Inspect(n.Expr, func(m parser.Node, _ []parser.Node) error {
				if vs, ok := m.(*parser.VectorSelector); ok {
					g.metrics = append(g.metrics, selectorOf(vs).metric)
				}
				return nil
			})
			u.grouping = append(u.grouping, g)
		}
		return nil
	})
	return u, nil
}

// selectorOf names a selector's metric, also when written {__name__="x"}.
func selectorOf(vs *parser.VectorSelector) selectorUse {
	s := selectorUse{metric: vs.Name}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName {
			if s.metric == "" && m.Type == labels.MatchEqual {
				s.metric = m.Value
			}
			continue
		}
		s.labels = append(s.labels, m.Name)
	}
	return s
}

// metricNames lists the distinct metric names a set of queries selects.
func metricNames(uses []queryUse) []string {
	var names []string
	for _, u := range uses {
		for _, s := range u.selectors {
			if !slices.Contains(names, s.metric) {
				names = append(names, s.metric)
			}
		}
	}
	sort.Strings(names)
	return names
}
