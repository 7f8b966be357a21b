package admin

import (
	"encoding/json"
	"strings"
	"testing"
)

// Every field of GET /v1/stats is described in the OpenAPI document, the
// reference of the admin API (docs/api.md): due_in was in the answer and
// in the dashboard but nowhere a reader could learn what its buckets
// count.
func TestStatsFieldsAreDescribed(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Description string `json:"description"`
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	stats, ok := doc.Components.Schemas["StatsView"]
	if !ok || len(stats.Properties) == 0 {
		t.Fatal("no StatsView in the OpenAPI document")
	}
	for name, p := range stats.Properties {
		if strings.TrimSpace(p.Description) == "" {
			t.Errorf("GET /v1/stats: %s has no description", name)
		}
	}
	dueIn := stats.Properties["due_in"].Description
	for _, bucket := range []string{"overdue", "minute", "hour", "day", "later", "parked"} {
		if !strings.Contains(dueIn, bucket) {
			t.Errorf("the description of due_in does not say what %s is: %q", bucket, dueIn)
		}
	}
}
