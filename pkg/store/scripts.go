package store

import (
	"crypto/sha1"
	"embed"
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// The Lua scripts are files of lua/ (one per script, named for what it
// does), with their shared parts in lua/lib/. Each file starts with a
// comment block that says what the script does, its ARGV and its reply, and
// carries directives, one per line:
//
//	--! keys: pool due meta   the keys the file itself touches, by name
//	--! include: due life     the lib files it calls (each says its own)
//	--! firing                it fires messages or records their outcome:
//	                          it may run at maxmemory (allow-oom)
//	--! function              it runs once or more per message: a Redis
//	                          that has functions (7.0) runs it as one
//	                          (luaFunction), its includes made once
//
// A script is assembled once, at start, as: the table K of its keys by
// name (KEYS in the order of shardKeyNames, a per-priority key there at
// priority 0, then the other priorities of every per-priority key in one
// run, from index PRIOFROM to PRIOTO) and NKEYS, how many there are, so
// that per-message keys follow at KEYS[NKEYS + j]; then the constants of
// the Go side (luaConstants: the hold band, the priorities, the park
// results, the stored layout...) and its includes, each once, after the
// ones it includes, of which it keeps the statements it needs (needed);
// then the file. A script gets the keys that it and its includes name,
// and no other.
//
//go:embed lua/*.lua lua/lib/*.lua
var luaFiles embed.FS

// shardKeyNames are the names a script's keys may have, in KEYS order:
// the keys of one shard (Keys), then the deployment's that a script may
// name instead (sinks, rate), which Go passes itself.
var shardKeyNames = []string{"pool", "due", "inflight", "ahead", "slot", "held", "holding", "meta", "dead", "groups", "next", "lease", "series", "tally", "deadby", "unconfirmed", "layout", "sinks", "rate"}

// script is a Lua file of lua/ ready to run, in one form per layout
// (layout.go): a script that reads or writes a message's state includes
// lua/lib/due.lua in layout 1 and lua/lib/due2.lua in layout 2; one that does not
// has the same form in both.
type script struct {
	name  string
	forms [LayoutNewest]*scriptForm // by layout, from Layout1
}

// scriptForm is a script assembled for one layout: flagged for a Redis that
// reads script flags, plain for one that does not (the same when it has
// none).
type scriptForm struct {
	name           string
	layout         int
	keys           []string // key names, in KEYS order (due...: one per priority)
	flagged, plain *redis.Script
	src            string       // the source, as plain runs it
	fn             *luaFunction // the function form, for a file marked "function"; nil else
}

// stateLibs is, per layout, the lib file a script's "--! include: due"
// takes.
var stateLibs = [LayoutNewest + 1]string{Layout1: "due", Layout2: "due2"}

// perPriority are the key names that stand for one key per priority.
var perPriority = []string{"due", "inflight", "ahead", "slot"}

// luaFile is a file of lua/ and its directives.
type luaFile struct {
	name     string
	body     string
	keys     []string
	includes []string
	firing   bool
	function bool
}

func readLua(name string) luaFile {
	b, err := luaFiles.ReadFile(name)
	if err != nil {
		panic(fmt.Sprintf("store: Lua file %s: %v", name, err))
	}
	f := luaFile{name: name, body: string(b)}
	for _, line := range strings.Split(f.body, "\n") {
		d, ok := strings.CutPrefix(strings.TrimSpace(line), "--!")
		if !ok {
			continue
		}
		key, val, _ := strings.Cut(strings.TrimSpace(d), ":")
		switch key {
		case "keys":
			f.keys = append(f.keys, strings.Fields(val)...)
		case "include":
			f.includes = append(f.includes, strings.Fields(val)...)
		case "firing":
			f.firing = true
		case "function":
			f.function = true
		default:
			panic(fmt.Sprintf("store: Lua file %s: unknown directive %q", name, line))
		}
	}
	for _, k := range f.keys {
		if !slices.Contains(shardKeyNames, k) {
			panic(fmt.Sprintf("store: Lua file %s: unknown key %q (one of %v)", name, k, shardKeyNames))
		}
	}
	// Each file names the keys it touches itself, so that a script gets
	// them: a key used and not named would be nil at run time.
	for _, m := range keyUse.FindAllStringSubmatch(f.body, -1) {
		if !slices.Contains(f.keys, m[1]) {
			panic(fmt.Sprintf("store: Lua file %s uses K.%s but does not name it in --! keys:", name, m[1]))
		}
	}
	if strings.Contains(f.body, "KEYS[") && !strings.Contains(f.body, "KEYS[NKEYS") && !strings.Contains(f.body, "KEYS[keybase") {
		panic(fmt.Sprintf("store: Lua file %s indexes KEYS by number: use K (and KEYS[NKEYS + j] for a message's own key)", name))
	}
	return f
}

var keyUse = regexp.MustCompile(`\bK\.([a-z]+)\b`)

// loadScript assembles lua/<name>.lua with its includes, once per layout.
func loadScript(name string) *script {
	main := readLua("lua/" + name + ".lua")
	sc := &script{name: name}
	for l := Layout1; l <= LayoutNewest; l++ {
		f := assemble(main, l)
		if l > Layout1 && f.plain.Hash() == sc.forms[l-2].plain.Hash() {
			f = sc.forms[l-2] // it reads no state: the same script
		}
		sc.forms[l-1] = f
	}
	return sc
}

// assemble builds main with its includes for layout l.
func assemble(main luaFile, l int) *scriptForm {
	libs := includes(main, l)
	want := map[string]bool{}
	for _, f := range append(libs, main) {
		for _, k := range f.keys {
			want[k] = true
		}
	}
	sc := &scriptForm{name: strings.TrimSuffix(path.Base(main.name), ".lua"), layout: l}
	// KEYS: each key named once, a per-priority one at priority 0; then,
	// in one run from PRIOFROM to PRIOTO, the per-priority ones at
	// priorities 1 to MaxPriority, which maxprio looks at with one EXISTS
	// and no table built (lua/lib/due.lua).
	at := map[string][]int{} // key name -> its KEYS index per priority
	n := 0
	for _, k := range shardKeyNames {
		if want[k] {
			n++
			at[k] = []int{n}
			sc.keys = append(sc.keys, k)
		}
	}
	prioFrom := n + 1
	for _, k := range perPriority {
		if want[k] {
			for range MaxPriority {
				n++
				at[k] = append(at[k], n)
				sc.keys = append(sc.keys, k)
			}
		}
	}
	var b strings.Builder
	b.WriteString("local K = {")
	for _, k := range shardKeyNames {
		switch {
		case !want[k]:
		case slices.Contains(perPriority, k):
			b.WriteString(k + " = {")
			for p, i := range at[k] {
				fmt.Fprintf(&b, "[%d] = KEYS[%d], ", p, i)
			}
			b.WriteString("}, ")
		default:
			fmt.Fprintf(&b, "%s = KEYS[%d], ", k, at[k][0])
		}
	}
	fmt.Fprintf(&b, "}\nlocal NKEYS = %d\nlocal PRIOFROM, PRIOTO = %d, %d\n", n, prioFrom, n)
	head := b.String()
	units := neededUnits(append([]luaFile{{name: "constants", body: luaConstants}}, libs...), main.body)
	for _, u := range units {
		b.WriteString(u.text)
		if !strings.HasSuffix(u.text, "\n") { // a file's last line without one
			b.WriteString("\n")
		}
	}
	b.WriteString(main.body)
	src := b.String()
	sc.plain = redis.NewScript(src)
	sc.src = src
	sc.flagged = sc.plain
	if main.firing {
		// The firing scripts may run when Redis is at maxmemory with
		// noeviction: they write little (a lease, a meta value) and acks
		// free memory, so firing goes on and makes room; parks and rejects
		// stay refused, which pauses ingest instead.
		sc.flagged = redis.NewScript("#!lua flags=allow-oom\n" + src)
	}
	if main.function {
		sc.fn = functionOf(head, units, main)
	}
	return sc
}

// luaFunction is a script assembled as the library of one Redis function
// (Redis 7), run with FCALL: the functions and constants of its includes
// are made once, when the library is loaded, where a script makes them
// again at each call (a third to a half of a hot script's call on a Redis
// woken for it, BenchmarkScriptPrelude).
type luaFunction struct {
	// name is the library's and its function's: "delaybridge_" and a hash
	// of the code, so that two builds side by side (a rolling upgrade)
	// never run each other's.
	name string
	code string // FUNCTION LOAD's argument
	// sets are the library's locals each call sets: callNames, then the
	// locals of the lib statements that run at each call. A call sets no
	// other: what the library made at load is the same at every call.
	sets []string
}

// callNames are what a call gives a function: its keys and arguments, and
// the table of keys by name and the indexes the head makes of them.
var callNames = []string{"KEYS", "ARGV", "K", "NKEYS", "PRIOFROM", "PRIOTO"}

// functionOf assembles main as a library: head (the statements that make
// callNames from KEYS) and units (the lib statements main needs, needed)
// split into what is made once, at load (local functions, and values
// computed without a call from nothing a call gives), and what runs at
// each call (a statement that calls something or is not a declaration,
// and a value computed from what such a statement or a call gives), its
// locals declared at load so that the lib's functions see them; then the
// main file, inside the function, with its flags (allow-oom for a firing
// script).
func functionOf(head string, units []luaUnit, main luaFile) *luaFunction {
	perCall := map[string]bool{}
	for _, n := range callNames {
		perCall[n] = true
	}
	names := func(code string) bool {
		return slices.ContainsFunc(luaIdent.FindAllString(code, -1), func(n string) bool { return perCall[n] })
	}
	atCall := make([]bool, len(units))
	for more := true; more; {
		more = false
		for i, u := range units {
			if atCall[i] || strings.TrimSpace(u.code) == "" || (u.declares != nil && (luaLocalFunc.MatchString(u.code) || !names(u.code))) {
				continue
			}
			atCall[i], more = true, true
			for _, n := range luaLocalNames(u.code) {
				perCall[n] = true
			}
		}
	}
	// The locals of what runs at each call are declared first, so that
	// every lib function sees them; a name declared by both would make the
	// call set the library's own.
	var load, call strings.Builder
	var hoisted []string
	atLoad := map[string]bool{}
	for i, u := range units {
		switch {
		case !atCall[i]:
			for _, n := range u.declares {
				atLoad[n] = true
			}
		case luaLocalNames(u.code) != nil:
			hoisted = append(hoisted, luaLocalNames(u.code)...)
		}
	}
	load.WriteString("local " + strings.Join(append(slices.Clone(callNames), hoisted...), ", ") + "\n")
	for _, n := range hoisted {
		if atLoad[n] {
			panic(fmt.Sprintf("store: Lua script %s: %s is declared both by a statement that runs at each call and by one made at load: rename one", main.name, n))
		}
	}
	for i, u := range units {
		if !atCall[i] {
			load.WriteString(u.code) // Redis keeps a library's text: comments left out
			if !strings.HasSuffix(u.code, "\n") {
				load.WriteString("\n")
			}
			continue
		}
		code := u.code
		if luaLocalNames(code) != nil {
			code = strings.TrimPrefix(code, "local ")
		}
		call.WriteString(code)
	}
	flags := ""
	if main.firing {
		flags = "'allow-oom'"
	}
	body := fmt.Sprintf("%sredis.register_function{function_name = NAME, flags = {%s}, callback = function(keys, args)\nKEYS, ARGV = keys, args\n%s%s%s\nend}\n",
		load.String(), flags, luaNoLocal.ReplaceAllString(head, ""), call.String(), luaCode(main.body))
	name := fmt.Sprintf("delaybridge_%x", sha1.Sum([]byte(body)))[:32]
	return &luaFunction{name: name, code: "#!lua name=" + name + "\nlocal NAME = '" + name + "'\n" + body, sets: append(slices.Clone(callNames), hoisted...)}
}

// luaNoLocal is the "local " that starts a line of the head.
var luaNoLocal = regexp.MustCompile(`(?m)^local `)

// luaLocalNames returns the names a statement declares as locals when it
// is a local declaration of values (with or without them), else nil.
func luaLocalNames(stmt string) []string {
	m := luaLocalDecl.FindStringSubmatch(stmt)
	if m == nil {
		return nil
	}
	var out []string
	for _, n := range strings.Split(m[1], ",") {
		out = append(out, strings.TrimSpace(n))
	}
	return out
}

var luaLocalDecl = regexp.MustCompile(`^local\s+([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*(?:=|\n|$)`)

// needed returns the top-level statements of libs that main needs, in
// their order. Redis runs a script's whole chunk at each call, so that
// every local function of an include is made again each time, used or not:
// about 20 µs a call, three times that on a Redis woken from idle, where
// the 80 functions a script's includes hold were made for the few it
// calls. A statement that declares locals (a local function, or a local
// value that calls nothing) is kept when a kept statement or main names
// one of them; any other statement (code the script runs, a value that
// calls something) is always kept. A name is any identifier in the text,
// comments included: a statement kept for nothing costs its time, one left
// out that a script needed would be a global's read, which
// TestScriptsReadOnlyRedisGlobals catches.
func needed(libs []luaFile, main string) string {
	var b strings.Builder
	for _, u := range neededUnits(libs, main) {
		b.WriteString(u.text)
		if !strings.HasSuffix(u.text, "\n") { // a file's last line without one
			b.WriteString("\n")
		}
	}
	return b.String()
}

// neededUnits returns the top-level statements of libs that main needs, in
// their order (needed).
func neededUnits(libs []luaFile, main string) []luaUnit {
	var units []luaUnit
	for _, lib := range libs {
		units = append(units, luaUnits(lib.body)...)
	}
	names := map[string]bool{}
	name := func(text string) {
		for _, id := range luaIdent.FindAllString(text, -1) {
			names[id] = true
		}
	}
	name(luaCode(main))
	keep := make([]bool, len(units))
	for i, u := range units {
		if u.declares == nil {
			keep[i] = true
			name(u.code)
		}
	}
	for more := true; more; {
		more = false
		for i, u := range units {
			if !keep[i] && slices.ContainsFunc(u.declares, func(n string) bool { return names[n] }) {
				keep[i], more = true, true
				name(u.code)
			}
		}
	}
	var out []luaUnit
	for i, u := range units {
		if keep[i] {
			out = append(out, u)
		}
	}
	return out
}

// includes returns the lib files main includes for layout l, each once,
// after the ones it includes.
func includes(main luaFile, l int) []luaFile {
	var libs []luaFile
	seen := map[string]bool{}
	var visit func(names []string)
	visit = func(names []string) {
		for _, n := range names {
			if seen[n] {
				continue
			}
			seen[n] = true
			file := n
			if n == "due" {
				file = stateLibs[l]
			}
			lib := readLua(path.Join("lua/lib", file+".lua"))
			visit(lib.includes) // what it calls comes first
			libs = append(libs, lib)
		}
	}
	visit(main.includes)
	return libs
}

// luaUnit is a top-level statement of a lib file with the comments before
// it, and the locals it declares when it may be left out (nil: it may not).
type luaUnit struct {
	text     string   // as written
	code     string   // without its comments but those at the end of a line
	declares []string // nil: always kept
}

var (
	luaIdent     = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	luaLocalFunc = regexp.MustCompile(`^local\s+function\s+([A-Za-z_][A-Za-z0-9_]*)`)
	luaLocalVals = regexp.MustCompile(`^local\s+([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*=`)
	luaGoesOn    = regexp.MustCompile(`^(end|else|elseif|until)\b|^[})\]]`)
)

// luaUnits splits a lib file into its top-level statements. The files
// keep to one form, which TestLibUnitsParseAlone holds them to: a
// statement starts at column 0, what goes on with it is indented or closes
// it at column 0 (end, else, elseif, until, a closing bracket), and a
// block comment (--[[ ... ]]) outside a function starts at column 0 too.
func luaUnits(body string) []luaUnit {
	var units []luaUnit
	var stmt, cur, waiting strings.Builder // waiting: comments not yet known to be inside the statement
	inComment := false
	flush := func() {
		if stmt.Len() > 0 {
			units = append(units, luaUnit{text: cur.String(), code: luaCode(stmt.String()), declares: luaDeclares(stmt.String())})
		}
		stmt.Reset()
		cur.Reset()
	}
	for line := range strings.Lines(body) {
		trimmed := strings.TrimSpace(line)
		switch {
		case inComment:
			inComment = !strings.Contains(line, "]]")
			waiting.WriteString(line)
		case strings.HasPrefix(line, "--[["):
			inComment = !strings.Contains(line[4:], "]]")
			waiting.WriteString(line)
		case trimmed == "" || strings.HasPrefix(line, "--"):
			waiting.WriteString(line)
		case line[0] == ' ' || line[0] == '\t' || luaGoesOn.MatchString(line):
			cur.WriteString(waiting.String())
			waiting.Reset()
			cur.WriteString(line)
			stmt.WriteString(line)
		default:
			flush()
			cur.WriteString(waiting.String())
			waiting.Reset()
			cur.WriteString(line)
			stmt.WriteString(line)
		}
	}
	flush()
	if waiting.Len() > 0 {
		units = append(units, luaUnit{text: waiting.String()})
	}
	return units
}

// luaCode returns text without its comment lines and block comments.
func luaCode(text string) string {
	var b strings.Builder
	inComment := false
	for line := range strings.Lines(text) {
		t := strings.TrimSpace(line)
		switch {
		case inComment:
			inComment = !strings.Contains(line, "]]")
		case strings.HasPrefix(t, "--[["):
			inComment = !strings.Contains(t[4:], "]]")
		case strings.HasPrefix(t, "--"):
		default:
			b.WriteString(line)
		}
	}
	return b.String()
}

// luaDeclares returns the locals a statement declares when leaving it out
// changes nothing but them: a local function, or local values made without
// a call.
func luaDeclares(stmt string) []string {
	if m := luaLocalFunc.FindStringSubmatch(stmt); m != nil {
		return []string{m[1]}
	}
	m := luaLocalVals.FindStringSubmatch(stmt)
	if m == nil || strings.Contains(stmt[len(m[0]):], "(") {
		return nil
	}
	var names []string
	for _, n := range strings.Split(m[1], ",") {
		names = append(names, strings.TrimSpace(n))
	}
	return names
}

// luaConstants are the Go constants the scripts use, written into every
// script: one edit of the Go side changes both.
var luaConstants = fmt.Sprintf(`-- generated by pkg/store/scripts.go from the Go constants
local HOLDBAND = %d
local MAXPRIO = %d
local LEASE_MARK = %s
local SLOT_MARK = %s
local AHEAD_MARK = %s
local FOLLOWS = %q
local ENDS = %q
local R = {KNOWN = %d, PARKED = %d, REPLACED = %d, DUPLICATE = %d, QUEUED = %d, NOTNEWER = %d, OVERSERIES = %d, FIRING = %d, IDTAKEN = %d, OVERSOURCE = %d}
local B = {V1 = %d, V2 = %d, V3 = %d, EXT_PUBLISHED = %d, EXT_GROUP = %d, EXT_RECUR = %d, EXT_ORIGIN = %d, EXT_PRINT = %d, FLAG_SOURCE = %d}
`, HoldBand, MaxPriority, leaseMark, slotMark, aheadMark, followsMark, endsMark,
	Known, Parked, Replaced, Duplicate, Queued, NotNewer, OverSeries, firing, IDTaken, OverSourceSeries,
	envelope.StoredLayout.V1, envelope.StoredLayout.V2, envelope.StoredLayout.V3,
	envelope.StoredLayout.ExtPublished, envelope.StoredLayout.ExtGroup, envelope.StoredLayout.ExtRecur,
	envelope.StoredLayout.ExtOrigin, envelope.StoredLayout.ExtPrint, envelope.StoredLayout.FlagSource)

// The marks a due-set score's fraction carries (due times are whole
// milliseconds): a claim's lease expiry + leaseMark, a max_rate publish
// slot + slotMark, a claim ahead of the due time (ClaimAhead) its lease
// expiry + aheadMark. As strings, the form both sides write them in.
const (
	leaseMark = "0.5"
	slotMark  = "0.25"
	aheadMark = "0.75"
)

// leased reports whether a due-set score is a lease expiry (+ leaseMark),
// as the scripts' leased does.
func leased(score float64) bool { return marked(score, leaseMark) }

// claimedAhead reports whether a due-set score is a claim ahead of the due
// time (+ aheadMark), as the scripts' ahead does: the message is not in
// flight, its due time is the stored message's.
func claimedAhead(score float64) bool { return marked(score, aheadMark) }

func marked(score float64, mark string) bool {
	m, _ := strconv.ParseFloat(mark, 64)
	return score-math.Floor(score) == m
}

// scriptKeys returns the KEYS of sc on shard, its deployment-wide keys
// (sinks, rate) given in order by them.
func (k Keys) scriptKeys(sc *scriptForm, shard int, deployment ...string) []string {
	out := make([]string, 0, len(sc.keys))
	p := map[string]int{}
	for _, name := range sc.keys {
		if slices.Contains(perPriority, name) { // DueAt, InflightAt, AheadAt, SlotAt
			out = append(out, k.atPriority(shard, name, p[name]))
			p[name]++
			continue
		}
		switch name {
		case "pool":
			out = append(out, k.Pool(shard))
		case "held":
			out = append(out, k.heldPrefix(shard))
		case "holding":
			out = append(out, k.Holding(shard))
		case "meta":
			out = append(out, k.Meta(shard))
		case "dead":
			out = append(out, k.Dead(shard))
		case "groups":
			out = append(out, k.Groups(shard))
		case "next":
			out = append(out, k.Next(shard))
		case "lease":
			out = append(out, k.Lease(shard))
		case "series":
			out = append(out, k.Series(shard))
		case "tally":
			out = append(out, k.Tally(shard))
		case "deadby":
			out = append(out, k.DeadBy(shard))
		case "unconfirmed":
			out = append(out, k.Unconfirmed(shard))
		case "layout":
			out = append(out, k.LayoutMark(shard))
		default: // sinks, rate
			if len(deployment) == 0 {
				panic(fmt.Sprintf("store: script %s needs its %s key", sc.name, name))
			}
			out = append(out, deployment[0])
			deployment = deployment[1:]
		}
	}
	return out
}
