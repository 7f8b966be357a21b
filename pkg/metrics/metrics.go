// Package metrics defines delaybridge's Prometheus metrics. Every metric
// is named delaybridge_*; docs/observability.md lists them with their labels.
//
//	metrics.go  the event metrics (counters, histograms): Metrics
//	state.go    the gauges of state, read at scrape time: NewStateCollector
//	rates.go    the publish rate per sink that GET /v1/sinks shows: RateMeter
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds every event metric (counters and histograms). Gauges of
// state (parked, due, dead, connection up) are computed at scrape time by
// the state collector (NewStateCollector). Create one per process with New; tests create
// their own.
type Metrics struct {
	Registry *prometheus.Registry

	IngestMessages *prometheus.CounterVec // ingest, result: parked|replaced|duplicate|stale|rejected|cancelled|cancelled_group|tombstone_unknown|handed_back
	IngestRejected *prometheus.CounterVec // ingest, reason
	ParkBatchSize  prometheus.Histogram
	ParkDuration   prometheus.Histogram

	Published        *prometheus.CounterVec   // sink
	PublishErrors    *prometheus.CounterVec   // sink, reason: a sinks.Reason
	PublishDuration  *prometheus.HistogramVec // sink
	FireLateness     *prometheus.HistogramVec // sink
	Retries          *prometheus.CounterVec   // sink
	DeadTotal        *prometheus.CounterVec   // source: ingest|sink|late
	DeadLetters      *prometheus.CounterVec   // result: ok|error
	ClaimBatchSize   prometheus.Histogram
	ScriptDuration   *prometheus.HistogramVec // script
	ScriptErrors     *prometheus.CounterVec   // script
	SchedulerWakeups *prometheus.CounterVec   // cause: timer|notify|batch
	Ahead            *prometheus.CounterVec   // result: committed|revoked|given_back
	SinkPaused       *prometheus.GaugeVec     // sink: 1 while paused
	Held             *prometheus.CounterVec   // sink: messages held because the sink was down or paused
	Deferred         *prometheus.CounterVec   // sink: messages that waited for a max_rate slot
	Skipped          prometheus.Counter       // occurrences of recurring messages passed over (route.missed skip)
	Fenced           prometheus.Counter       // claimed messages not published: their lease was nearly over
}

// New creates and registers every collector on a new registry, with the Go
// runtime and process collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := factory{reg}
	latency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	batches := prometheus.ExponentialBuckets(1, 2, 14) // 1 .. 8192
	return &Metrics{
		Registry: reg,
		IngestMessages: f.counterVec("delaybridge_ingest_messages_total",
			"Messages read from an ingest, by what became of them.", "ingest", "result"),
		IngestRejected: f.counterVec("delaybridge_ingest_rejected_total",
			"Ingested messages rejected (kept as dead), by reason.", "ingest", "reason"),
		ParkBatchSize: f.histogram("delaybridge_park_batch_size",
			"Messages parked per Redis round trip.", batches),
		ParkDuration: f.histogram("delaybridge_park_duration_seconds",
			"Time to park one batch in Redis.", latency),
		Published: f.counterVec("delaybridge_sink_published_total",
			"Messages confirmed by a sink.", "sink"),
		PublishErrors: f.counterVec("delaybridge_sink_publish_errors_total",
			"Failed publish attempts, by reason: unroutable, not_found, too_large, unauthorized, invalid, timeout, unavailable, rejected, other.", "sink", "reason"),
		PublishDuration: f.histogramVec("delaybridge_sink_publish_duration_seconds",
			"Time for a sink to confirm one batch.", latency, "sink"),
		FireLateness: f.histogramVec("delaybridge_fire_lateness_seconds",
			"Time from a message's due time to the sink's confirmation.",
			[]float64{.00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}, "sink"),
		Retries: f.counterVec("delaybridge_retries_total",
			"Publish attempts rescheduled with back-off.", "sink"),
		DeadTotal: f.counterVec("delaybridge_dead_total",
			"Messages that became dead, by where: ingest (rejected), sink (undeliverable), late (late_policy dead).", "source"),
		DeadLetters: f.counterVec("delaybridge_dead_letters_total",
			"Copies of dead messages published to dead.sink, by result: ok, error.", "result"),
		ClaimBatchSize: f.histogram("delaybridge_claim_batch_size",
			"Due messages taken per claim.", batches),
		ScriptDuration: f.histogramVec("delaybridge_redis_script_duration_seconds",
			"Redis script round trips, by script.", latency, "script"),
		ScriptErrors: f.counterVec("delaybridge_redis_script_errors_total",
			"Redis script errors, by script.", "script"),
		SchedulerWakeups: f.counterVec("delaybridge_scheduler_wakeups_total",
			"Shard scheduler wake-ups, by cause: timer, notify (a sooner message was parked), batch (a full claim).", "cause"),
		Ahead: f.counterVec("delaybridge_fire_ahead_total",
			"Messages claimed ahead of their due time (scheduler.fire_ahead), by what the commit just before the due instant did: committed (published), revoked (cancelled, replaced or rescheduled first), given_back (their sink blocked, or a stop).", "result"),
		SinkPaused: f.gaugeVec("delaybridge_sink_paused",
			"1 while the sink is paused (POST /v1/sinks/{name}/pause), for every instance.", "sink"),
		Held: f.counterVec("delaybridge_sink_held_total",
			"Messages whose publish found their sink unavailable, held for it (their attempts not counted); those a claim holds for a sink already blocked or paused are in delaybridge_held_messages, not here.", "sink"),
		Deferred: f.counterVec("delaybridge_sink_deferred_total",
			"Messages that waited for a publish slot of their sink's max_rate.", "sink"),
		Skipped: f.counter("delaybridge_recurring_skipped_total",
			"Occurrences of recurring messages passed over after downtime (route.missed: skip)."),
		Fenced: f.counter("delaybridge_lease_fenced_total",
			"Claimed messages put back unpublished because less than scheduler.lease_margin of their lease was left (the process was paused or starved): claimed again before any publish."),
	}
}

// ObserveScript records one Redis script call (store.Options.Observe).
func (m *Metrics) ObserveScript(op string, d time.Duration, err error) {
	m.ScriptDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.ScriptErrors.WithLabelValues(op).Inc()
	}
}

type factory struct{ reg *prometheus.Registry }

func (f factory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f factory) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	c := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Histogram {
	c := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	f.reg.MustRegister(c)
	return c
}

func (f factory) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	c := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	f.reg.MustRegister(c)
	return c
}

// CountDeadLetters records dead-letter copies (sinks.DeadLetter.Count).
func (m *Metrics) CountDeadLetters(ok, failed int) {
	m.DeadLetters.WithLabelValues("ok").Add(float64(ok))
	m.DeadLetters.WithLabelValues("error").Add(float64(failed))
}
