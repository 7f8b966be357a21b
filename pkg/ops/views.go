package ops

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The views are what the operations answer: the JSON of the admin API and
// of the command line's --json, and what the dashboard reads. Times are
// RFC 3339 in UTC with milliseconds (envelope.FormatTime), "" (left out)
// for none.

// MessageView is a message as GET /v1/messages/{id}, GET /v1/dead/{id} and
// `delaybridge inspect` show it.
type MessageView struct {
	ID          string `json:"id"`
	State       string `json:"state" enum:"scheduled,held,inflight,dead"`
	DueAt       string `json:"due_at"` // "" when the stored message cannot be decoded
	Sink        string `json:"sink"`
	Destination string `json:"destination"`
	Attempts    int    `json:"attempts"`

	Ingest     string `json:"ingest"` // "" for messages scheduled through the admin API
	IngestedAt string `json:"ingested_at,omitempty"`
	Priority   uint8  `json:"priority"`
	// NextAttemptAt is set when the message will be tried at another time
	// than its due time: scheduled again after a failed attempt, or in
	// flight (then the lease expiry, when it is retried if the publish is
	// not confirmed).
	NextAttemptAt string `json:"next_attempt_at,omitempty"`
	LastError     string `json:"last_error,omitempty"` // the error of the last failed attempt
	Reason        string `json:"reason,omitempty"`     // dead: why
	DeadAt        string `json:"dead_at,omitempty"`
	Size          int    `json:"size"`                   // encoded bytes in Redis
	DecodeError   string `json:"decode_error,omitempty"` // the stored message cannot be decoded

	// Group is the message's x-delay-group ("" for none).
	Group string `json:"group,omitempty"`
	// Held is set while a scheduled message waits for its sink, which is
	// paused or down: it fires at its due time once the sink takes
	// messages again, or at once when that time has passed.
	Held bool `json:"held,omitempty"`
	// Recurrence is the schedule of a recurring message; due_at is the
	// time of the occurrence parked now.
	Recurrence *RecurrenceView `json:"recurrence,omitempty"`

	// The content: only when asked for. Headers may carry credentials
	// meant for the consumer, so they are treated like the body.
	Key        *string           `json:"key,omitempty"`
	KeyBase64  *string           `json:"key_base64,omitempty"`
	Headers    map[string]string `json:"headers,omitempty"` // forwarded headers; the first value of a repeated header
	Body       *string           `json:"body,omitempty"`
	BodyBase64 *string           `json:"body_base64,omitempty"`
}

// NewMessageView converts what the store knows of a message; its content
// (key, headers and body) only when withContent.
func NewMessageView(info *store.Info, withContent bool) MessageView {
	v := MessageView{ID: info.ID, State: info.State, Attempts: info.Attempts, Size: info.EncodedSize}
	switch info.State {
	case store.StateDead:
		v.Reason = info.Reason
		v.DeadAt = formatTime(info.DeadAt)
	default:
		v.LastError = info.Reason
	}
	m := info.Message
	if m == nil {
		if info.Err != nil {
			v.DecodeError = info.Err.Error()
		}
		if info.State != store.StateDead {
			v.NextAttemptAt = formatTime(info.NextAt)
		}
		if c := info.Clear; c != nil { // what is stored in clear of a message that cannot be read whole
			v.DueAt, v.Sink, v.Destination = envelope.FormatTime(c.DueAt), c.Sink, c.Destination
			v.Ingest, v.IngestedAt, v.Priority = c.Ingest, formatTime(c.IngestedAt), c.Priority
		}
		return v
	}
	v.DueAt = envelope.FormatTime(m.DueAt)
	v.Sink, v.Destination = m.Sink, m.Destination
	v.Ingest, v.IngestedAt, v.Priority = m.Ingest, formatTime(m.IngestedAt), m.Priority
	v.Group, v.Held = m.Group, info.Held
	if m.Recur != nil {
		// A dead occurrence, or one whose series a cancel ended, has no
		// following one.
		v.Recurrence = NewRecurrenceView(m.Recur, m.DueAt, info.State == store.StateDead || info.SeriesEnds)
	}
	if info.State == store.StateInflight || ((info.State == store.StateScheduled || info.State == store.StateHeld) && !info.NextAt.Equal(m.DueAt)) {
		v.NextAttemptAt = formatTime(info.NextAt)
	}
	if !withContent {
		return v
	}
	if m.Key != nil {
		v.Key, v.KeyBase64 = textOrBase64(m.Key)
	}
	v.Headers = map[string]string{}
	for _, h := range m.Headers {
		if _, seen := v.Headers[h.Key]; !seen && !envelope.IsControlHeader(h.Key) {
			v.Headers[h.Key] = h.Value
		}
	}
	v.Body, v.BodyBase64 = textOrBase64(m.Body)
	return v
}

// RecurrenceView is the schedule of a recurring message.
type RecurrenceView struct {
	// Schedule is the whole schedule in words: "every 1h0m0s",
	// "cron 0 9 * * MON in Europe/Berlin until 2026-12-31T00:00:00.000Z, 10 times".
	Schedule string `json:"schedule"`
	Every    string `json:"every,omitempty"`    // x-delay-every, a Go duration
	Cron     string `json:"cron,omitempty"`     // x-delay-cron
	TimeZone string `json:"timezone,omitempty"` // x-delay-timezone of the cron
	Until    string `json:"until,omitempty"`    // no occurrence after it
	Count    int    `json:"count,omitempty"`    // at most this many occurrences
	// Occurrence is the number of the occurrence parked now, from 1: the
	// ones before it were published (or, under route.missed, passed over).
	Occurrence int `json:"occurrence"`
	// NextAt is when the parked occurrence fires: the message's due_at.
	NextAt string `json:"next_at"`
	// FollowingAt is when the occurrence after it is due, by the schedule
	// as it stands; absent when the parked one is the last.
	FollowingAt string `json:"following_at,omitempty"`
	Missed      string `json:"missed" enum:"once,all,skip"` // route.missed
	// MissedMax is route.missed_max, kept with the series: how many missed
	// occurrences missed all publishes at most.
	MissedMax int `json:"missed_max"`
}

// NewRecurrenceView describes r, whose parked occurrence is due at due;
// last says it is the series' last, whatever the schedule says.
func NewRecurrenceView(r *envelope.Recurrence, due time.Time, last bool) *RecurrenceView {
	v := &RecurrenceView{Schedule: r.String(), Cron: r.Cron, TimeZone: r.TimeZone, Count: r.Count, Occurrence: r.N,
		NextAt: envelope.FormatTime(due), Missed: r.Missed.String(), MissedMax: r.MissedBound()}
	if r.Every > 0 {
		v.Every = r.Every.String()
	}
	if !r.Until.IsZero() {
		v.Until = envelope.FormatTime(r.Until)
	}
	if next, _, ok := r.Next(due, due); ok && !last {
		v.FollowingAt = envelope.FormatTime(next)
	}
	return v
}

// ListView is a page of a listing (GET /v1/messages, `delaybridge list
// --json`): messages in the order they fire, and the cursor of the next
// page.
type ListView struct {
	Messages []MessageView `json:"messages"`
	// NextCursor continues the listing; null when it is done. A filtered
	// page may hold fewer messages than its limit, even none, and still
	// have a next cursor: it stopped after examining its bound.
	NextCursor *string `json:"next_cursor" nullable:"true"`
	// Examined is how many parked messages the page looked at.
	Examined int `json:"examined"`
}

// NewListView converts a page.
func NewListView(p *store.Page, withContent bool) ListView {
	v := ListView{Messages: make([]MessageView, 0, len(p.Messages)), Examined: p.Examined}
	for _, info := range p.Messages {
		v.Messages = append(v.Messages, NewMessageView(info, withContent))
	}
	if p.Next != "" {
		next := p.Next
		v.NextCursor = &next
	}
	return v
}

// GroupView is a group's size and a page of its messages in the order
// they fire (GET /v1/groups/{key}, `delaybridge groups show`).
type GroupView struct {
	Group string `json:"group"`
	// Count is every message filed under the group: scheduled, in flight
	// and dead.
	Count int64 `json:"count"`
	ListView
}

// CancelGroupView is what cancelling a group did.
type CancelGroupView struct {
	Group     string `json:"group"`
	Cancelled int    `json:"cancelled"`
	// InFlight counts the messages of the group being published, which
	// were not cancelled (each may still be delivered).
	InFlight int `json:"inflight"`
}

// StatsView is GET /v1/stats (and `delaybridge stats --json`). Each field's
// doc tag is its description in the OpenAPI document (docs/api.md).
type StatsView struct {
	Parked int64 `json:"parked" doc:"Parked messages: scheduled, held and in flight."`
	Due    int64 `json:"due" doc:"Parked messages already due (their due time, or their next attempt's, has come): the backlog."`
	Dead   int64 `json:"dead" doc:"Dead messages kept (GET /v1/dead lists them)."`
	// OldestDueAgeSeconds is how long the oldest due message has been
	// waiting: a growing value means the daemon does not keep up.
	OldestDueAgeSeconds float64            `json:"oldest_due_age_seconds" doc:"How long the oldest due message has waited, in seconds; a value that grows means the daemons do not keep up."`
	Shards              []store.ShardStats `json:"shards" doc:"parked, due and dead of each shard that answered."`
	// UnansweredShards are the shards left out of every count: their
	// master out of reach or in a failover (a Redis Cluster with a master
	// down); Warning says so.
	UnansweredShards []int `json:"unanswered_shards,omitempty" doc:"Shards that did not answer (their master out of reach, or in a failover): every count leaves them out, and warning says why."`
	// Warning is set when a count leaves something out or reads it as
	// last known.
	Warning string `json:"warning,omitempty" doc:"Set when the counts leave shards out (which, and the error) or count held messages in the hold bands as last read (the sinks record did not answer)."`
	// DueIn counts the parked messages by when they come due:
	// {"overdue","minute","hour","day","later"}; overdue is Due, and
	// together they are Parked.
	DueIn store.DueIn `json:"due_in" doc:"The parked messages by when they come due, each in one bucket: overdue (due already: the same as due), minute (within the next minute), hour (after the first minute, within the hour), day (after the first hour, within 24 h), later (after 24 h); together they are parked. forecast counts the same messages by window instead."`
	// Forecast counts what fires within each window from now:
	// {"1m","5m","1h","24h","later"}; each window includes the shorter
	// ones and what is due already, later is what comes due after 24 h.
	Forecast store.Forecast `json:"forecast" doc:"What fires within each window from now: 1m, 5m, 1h, 24h, each including the shorter ones and what is due already, and later (after 24 h)."`
	// Held counts the parked messages held for a sink that is paused or
	// down (by their due times, they are in due_in and forecast too).
	Held int64 `json:"held" doc:"Parked messages held for a sink that is paused or down; by their due times they are in due_in and forecast too."`
	// RedisPersistence is what Redis keeps on disk, as the daemon read it
	// last; absent where nothing read it.
	RedisPersistence *PersistenceView `json:"redis_persistence,omitempty" doc:"What Redis keeps on disk, as the daemon read it last (at start, each reconnect and every minute); absent where nothing read it."`
}

// PersistenceView is whether what Redis holds survives a restart of Redis
// (GET /v1/stats "redis_persistence"): its persistence settings as the
// daemon read them (CONFIG GET appendonly and save) at its start, at each
// reconnect and every minute, on every master of a Redis Cluster and on the
// master that Sentinel names. A Redis with neither AOF nor RDB snapshots
// loses every parked message when it restarts.
type PersistenceView struct {
	// AOF is true when every master appends each write to its append-only
	// file (appendonly yes); null when unknown.
	AOF *bool `json:"aof" nullable:"true" doc:"Every master has appendonly yes; null when unknown."`
	// RDB is true when every master takes snapshots (save has a rule);
	// null when unknown.
	RDB *bool `json:"rdb" nullable:"true" doc:"Every master has a save rule (RDB snapshots); null when unknown."`
	// Warning is set when a master keeps neither: it names the masters and
	// what to set (appendonly yes, appendfsync everysec). The daemon logs
	// it at WARN and /readyz lists it among its warnings.
	Warning string `json:"warning,omitempty" doc:"Set when a master keeps neither AOF nor RDB (a restart of Redis loses its parked messages): the masters and what to set."`
	// Unknown says why the settings could not be read: a managed Redis
	// may refuse CONFIG (then AOF and RDB are null), or Redis was not
	// reachable at the last try.
	Unknown string `json:"unknown,omitempty" doc:"Why the settings are unknown: a master refused CONFIG GET (managed Redis services do), or they were not read yet."`
	// CheckedAt is when they were last read successfully; "" if never.
	CheckedAt string `json:"checked_at,omitempty" doc:"When they were last read."`
}

// NewStatsView converts store stats.
func NewStatsView(st *store.Stats) StatsView {
	v := StatsView{Parked: st.Parked, Due: st.Due, Dead: st.Dead, Shards: st.Shards, DueIn: st.DueIn, Forecast: st.Forecast, Held: st.Held}
	if !st.OldestDue.IsZero() {
		v.OldestDueAgeSeconds = max(0, st.Now.Sub(st.OldestDue).Seconds())
	}
	if v.Shards == nil {
		v.Shards = []store.ShardStats{}
	}
	var warn []string
	if len(st.Unanswered) > 0 {
		v.UnansweredShards = slices.Clone(st.Unanswered)
		warn = append(warn, fmt.Sprintf("%d of %d shards did not answer and every count leaves them out (shards %v; is a master down or failing over?): %v",
			len(st.Unanswered), len(st.Unanswered)+len(st.Shards), st.Unanswered, st.UnansweredErr))
	}
	if st.BandsErr != nil {
		warn = append(warn, st.BandsErr.Error())
	}
	v.Warning = strings.Join(warn, "; ")
	return v
}

// DeadView is one entry of a list of dead messages (GET /v1/dead,
// `delaybridge dead list --json`).
type DeadView struct {
	ID          string `json:"id"`
	Reason      string `json:"reason"`
	DeadAt      string `json:"dead_at"`
	Attempts    int    `json:"attempts"`
	DueAt       string `json:"due_at,omitempty"`
	Sink        string `json:"sink"`
	Destination string `json:"destination"`
	Ingest      string `json:"ingest"`
	Size        int    `json:"size"`                   // encoded bytes in Redis
	DecodeError string `json:"decode_error,omitempty"` // the stored message cannot be decoded
}

// NewDeadView converts a dead message.
func NewDeadView(info *store.Info) DeadView {
	v := DeadView{ID: info.ID, Reason: info.Reason, DeadAt: formatTime(info.DeadAt), Attempts: info.Attempts, Size: info.EncodedSize}
	m := info.Message
	if m == nil {
		if info.Err != nil {
			v.DecodeError = info.Err.Error()
		}
		m = info.Clear // what is stored in clear of a message that cannot be read whole
	}
	if m != nil {
		v.DueAt = envelope.FormatTime(m.DueAt)
		v.Sink, v.Destination, v.Ingest = m.Sink, m.Destination, m.Ingest
	}
	return v
}

// PurgedView is what purging dead messages did.
type PurgedView struct {
	Deleted int `json:"deleted"`
}

// RescheduleView is what a reschedule set.
type RescheduleView struct {
	ID    string `json:"id"`
	DueAt string `json:"due_at"` // the due time set
	// Now is set when the new time had passed: the message is due now.
	Now bool `json:"now,omitempty"`
}

// PostedView is what scheduling a message did (POST /v1/messages).
type PostedView struct {
	ID    string `json:"id"`
	DueAt string `json:"due_at"`
	// Duplicate is set when the ID was already known (parking is
	// idempotent): nothing changed, and due_at is the known message's.
	Duplicate bool `json:"duplicate,omitempty"`
}

// SinkStatus is what a running daemon knows of one configured sink
// (Params.Sinks).
type SinkStatus struct {
	Name string
	// Known is false when nothing runs that could tell whether the sink is
	// connected (the command line reading Redis): Ready, Blocked and Rate
	// are then unknown.
	Known bool
	Ready error // nil when this instance is connected to it
	// Paused is the pause as this instance applies it (Redis has the
	// pause; an instance reads it at its refresh).
	Paused  bool
	Blocked bool    // this instance holds its due messages: paused, down or failing
	Rate    float64 // messages/s this instance published to it lately
	MaxRate float64 // sinks[].max_rate; 0: none
}

// SinkView is one sink (GET /v1/sinks, `delaybridge sinks --json`).
type SinkView struct {
	Name string `json:"name"`
	// Status sums the others up: "ready" (messages fire to it), "paused"
	// (for every instance, until resumed), "pausing" and "resuming" (the
	// pause in Redis changed, and this instance applies it at its next
	// refresh, within scheduler.max_sleep), "blocked" (this instance cannot
	// reach it, or a publish just failed for a reason that was not the
	// message's: its due messages wait), "unknown" (no daemon asked).
	Status string `json:"status" enum:"ready,paused,pausing,resuming,blocked,unknown"`
	// Ready is whether this instance is connected to the sink (null when
	// unknown). A paused sink can be ready.
	Ready *bool  `json:"ready" nullable:"true"`
	Error string `json:"error,omitempty"` // why it is not ready
	// Paused is the pause kept in Redis, for every instance and across
	// restarts.
	Paused bool `json:"paused"`
	// Due counts the sink's due messages that wait for it: held while it
	// is paused or down, and released to fire (by priority, then in due order) once it takes
	// messages again.
	Due int64 `json:"due"`
	// Rate is what this instance published to the sink, in messages/s over
	// the last 10 s (null when unknown); with several instances each shows
	// its own.
	Rate *float64 `json:"rate" nullable:"true"`
	// MaxRate is the max_rate in force, the limit every instance shares
	// through Redis: sinks[].max_rate of the last instance to start, as it
	// recorded it there (else this instance's); 0 means none.
	MaxRate float64 `json:"max_rate"`
	// Released, in the answer of a resume, counts the messages the pause
	// held that the resume released to fire (by priority, then in due order): at once on the
	// instance that answered (status ready), at their next refresh on the
	// others (within scheduler.max_sleep). Due, read after the release, no
	// longer counts them, but for a backlog whose release outlasts the
	// answer (5 s), which goes on at each refresh.
	Released int64 `json:"released,omitempty"`
}

// textOrBase64 returns b as text when it is valid UTF-8, else base64.
func textOrBase64(b []byte) (text, b64 *string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	s := base64.StdEncoding.EncodeToString(b)
	return nil, &s
}

// formatTime is envelope.FormatTime, "" for the zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return envelope.FormatTime(t)
}
