package ops

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// ruleFile is the part of a Prometheus rule file these tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no rules", rulesFile)
	}
	return rules
}

// promtool runs promtool with args in dir and fails the test with its output
// when it exits non-zero.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(testenv.Promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// promtool check rules: the file is valid and every expression parses, as the
// Prometheus that loads it will see it (Debian's promtool 2.42).
func TestRulesCheck(t *testing.T) {
	out := promtool(t, ".", "check", "rules", rulesFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules: %s", out)
	}
}

// promtool test rules: for every alert, series that fire it and series that
// must not (deploy/prometheus/delaybridge.rules_test.yml), with the
// annotations as rendered.
func TestRulesUnitTests(t *testing.T) {
	out := promtool(t, filepath.Dir(rulesTestFile), "test", "rules", filepath.Base(rulesTestFile))
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules: %s", out)
	}
}

// Every alert has a for:, a severity, a summary, a description that says what to
// check first, and a runbook_url whose anchor is a subsection of the "Alert
// runbook" section of docs/operations.md; and the unit tests have, for every
// alert, a case where it fires and one where it must not.
func TestAlertsAreDocumentedAndTested(t *testing.T) {
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, runbook, ok := strings.Cut(string(doc), "\n## Alert runbook\n")
	if !ok {
		t.Fatalf("%s has no \"## Alert runbook\" section", operationsDoc)
	}
	if next := regexp.MustCompile(`(?m)^## `).FindStringIndex(runbook); next != nil {
		runbook = runbook[:next[0]]
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^### (.+)$`).FindAllStringSubmatch(runbook, -1) {
		anchors[githubAnchor(m[1])] = true
	}
	fires, mustNot := unitTestCases(t)

	var alerts []string
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			continue
		}
		alerts = append(alerts, r.Alert)
		if r.For == "" {
			t.Errorf("%s: no for:", r.Alert)
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
		}
		if r.Annotations["summary"] == "" {
			t.Errorf("%s: no summary", r.Alert)
		}
		if !strings.Contains(r.Annotations["description"], "Check first") {
			t.Errorf("%s: the description does not say what to check first", r.Alert)
		}
		url := r.Annotations["runbook_url"]
		path, anchor, _ := strings.Cut(url, "#")
		if path != "docs/operations.md" || anchor != githubAnchor(r.Alert) || !anchors[anchor] {
			t.Errorf("%s: runbook_url %q: want docs/operations.md#%s, a \"### %s\" in its Alert runbook section",
				r.Alert, url, githubAnchor(r.Alert), r.Alert)
		}
		if !fires[r.Alert] {
			t.Errorf("%s: no unit test where it fires (%s)", r.Alert, rulesTestFile)
		}
		if !mustNot[r.Alert] {
			t.Errorf("%s: no unit test where it must not fire (%s)", r.Alert, rulesTestFile)
		}
	}
	for a := range anchors {
		if !slices.ContainsFunc(alerts, func(name string) bool { return githubAnchor(name) == a }) {
			t.Errorf("the runbook has a section %q for no alert", a)
		}
	}
}

// unitTestCases reads the unit tests: the alerts expected to fire somewhere,
// and those expected to be silent somewhere (an alert_rule_test without
// exp_alerts: promtool then fails if anything fires).
func unitTestCases(t *testing.T) (fires, mustNot map[string]bool) {
	t.Helper()
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	fires, mustNot = map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				mustNot[a.Alertname] = true
			}
		}
	}
	return fires, mustNot
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
