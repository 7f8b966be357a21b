package store

import (
	"context"
	"io/fs"
	"path"
	"slices"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// redisGlobals are the globals Redis gives a script (Lua 5.1's base
// library as Redis loads it, and its own tables) that the scripts read.
var redisGlobals = []string{
	"ARGV", "KEYS", "bit", "cjson", "error", "ipairs", "math", "next", "pairs",
	"pcall", "redis", "select", "string", "table", "tonumber", "tostring", "type", "unpack",
}

// TestScriptsReadOnlyRedisGlobals compiles every script as it is assembled
// for each layout (needed leaves out what it does not call) and fails on a
// global it reads or writes that Redis does not give: a local function
// left out that the script calls, or a name mistyped, is a global's read
// that Redis would refuse only when that line runs.
func TestScriptsReadOnlyRedisGlobals(t *testing.T) {
	names, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil || len(names) == 0 {
		t.Fatal(names, err)
	}
	for _, name := range names {
		sc := loadScript(strings.TrimSuffix(path.Base(name), ".lua"))
		for _, f := range sc.forms {
			reads, writes := luaGlobals(t, f.name, f.src)
			for _, g := range reads {
				if !slices.Contains(redisGlobals, g) {
					t.Errorf("%s (layout %d) reads the global %q: a local it needs is left out, or a name is mistyped", f.name, f.layout, g)
				}
			}
			for _, g := range writes {
				t.Errorf("%s (layout %d) writes the global %q: Redis refuses it", f.name, f.layout, g)
			}
			if f.fn == nil {
				continue
			}
			_, code, _ := strings.Cut(f.fn.code, "\n") // after "#!lua name=..."
			reads, writes = luaGlobals(t, f.name+" (function)", code)
			for _, g := range reads {
				if !slices.Contains(redisGlobals, g) || g == "KEYS" || g == "ARGV" {
					t.Errorf("%s (layout %d) as a function reads the global %q: a local it needs is left out of the library, or made inside the call", f.name, f.layout, g)
				}
			}
			for _, g := range writes {
				t.Errorf("%s (layout %d) as a function writes the global %q: Redis refuses it", f.name, f.layout, g)
			}
		}
	}
}

// TestFunctionsKeepNothingBetweenCalls: Redis keeps a function library's
// locals from one call to the next, where a script starts afresh at each.
// So a call of a function form sets only the locals a call gives
// (luaFunction.sets) and writes into no table the library made at load:
// whatever one call left there, the next would read. Checked on the
// compiled code (gopher-lua): an upvalue set, and a table read from an
// upvalue and then written into.
func TestFunctionsKeepNothingBetweenCalls(t *testing.T) {
	for _, f := range functionForms(t) {
		_, code, _ := strings.Cut(f.fn.code, "\n")
		for _, w := range upvalueWrites(t, f.name, code) {
			if !slices.Contains(f.fn.sets, w) {
				t.Errorf("%s (layout %d) as a function changes %s, which its library made at load: the next call would see it changed", f.name, f.layout, w)
			}
		}
	}
}

// functionForms returns the function form of every script that has one,
// in each layout; at least the hot path's six.
func functionForms(t *testing.T) []*scriptForm {
	t.Helper()
	names, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil || len(names) == 0 {
		t.Fatal(names, err)
	}
	var out []*scriptForm
	for _, name := range names {
		for _, f := range loadScript(strings.TrimSuffix(path.Base(name), ".lua")).forms {
			if f.fn != nil && !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	if len(out) < 6 {
		t.Fatalf("%d function forms: the hot path's scripts are marked \"function\"", len(out))
	}
	return out
}

// TestUpvalueWritesSeesState holds the check of
// TestFunctionsKeepNothingBetweenCalls to what it must find: tables and a
// value of the chunk's changed by a call (written into, a table in one,
// through table.insert and rawset), and not a call's own.
func TestUpvalueWritesSeesState(t *testing.T) {
	got := upvalueWrites(t, "x", `local T, n, ok, L, U, V = {}, 0, {}, {}, {a = {}}, {}
local function bump() n = n + 1 end
local function add(x) table.insert(L, x) end
redis.register_function{function_name = 'x', callback = function(keys, args)
  local own = {}
  local function f() own[1] = ok[1]; table.insert(own, ok.x) end
  f()
  T[1] = 1
  bump()
  add(2)
  U.a.b = 1
  rawset(V, 1, 2)
  return 0
end}
`)
	if want := []string{"L[...]", "T[...]", "U[...]", "V[...]", "n"}; !slices.Equal(got, want) {
		t.Fatalf("upvalueWrites: %v, want %v", got, want)
	}
}

// upvalueWrites returns what the functions of src write that the chunk
// made: a chunk's local set from a function (OP_SETUPVAL), or a table held
// in one, or in a table of one, written into (OP_SETTABLE, or a call of
// table.insert, table.remove, table.sort or rawset on it), as far as a
// straight reading of each function's code tells (a table a function
// returns is not followed). Which upvalue is the chunk's is read from the
// instructions that follow each OP_CLOSURE: a MOVE captures a local of the
// function that makes the closure, a GETUPVAL one of its upvalues.
func upvalueWrites(t *testing.T, name, src string) []string {
	t.Helper()
	proto := compileLua(t, name, src)
	// gopher-lua's instructions (its opcode file): the opcode in the top 6
	// bits, then A (8 bits), C (9) and B (the low 9); Bx the low 18; an RK
	// operand of 256 or more is the constant of that index less 256. Its
	// instruction set has Lua 5.1's and GETTABLEKS, SETTABLEKS (a constant
	// string key) and MOVEN (moves in a row).
	abc := func(i uint32) (op, a, b, c int) {
		return int(i >> 26), int(i>>18) & 0xff, int(i & 0x1ff), int(i>>9) & 0x1ff
	}
	mutators := map[string]bool{"table.insert": true, "table.remove": true, "table.sort": true, "rawset": true}
	var out []string
	var walk func(p *lua.FunctionProto, top bool, chunkUp []bool)
	walk = func(p *lua.FunctionProto, top bool, chunkUp []bool) {
		// What a register last got: a chunk's local (or a table in one),
		// or a global function of mutators.
		type held struct{ local, fn string }
		regs := map[int]held{}
		constant := func(rk int) string {
			if rk >= 256 && rk-256 < len(p.Constants) {
				return p.Constants[rk-256].String()
			}
			return ""
		}
		for pc := 0; pc < len(p.Code); pc++ {
			op, a, b, c := abc(p.Code[pc])
			switch op {
			case lua.OP_CLOSURE:
				child := p.FunctionPrototypes[int(p.Code[pc]&0x3ffff)]
				up := make([]bool, child.NumUpvalues)
				for i := range up {
					pc++
					cop, _, cb, _ := abc(p.Code[pc])
					up[i] = (cop == lua.OP_MOVE && top) || (cop == lua.OP_GETUPVAL && chunkUp[cb])
				}
				walk(child, false, up)
			case lua.OP_SETUPVAL:
				if chunkUp[b] {
					out = append(out, p.DbgUpvalues[b])
				}
			case lua.OP_GETUPVAL:
				if chunkUp[b] {
					regs[a] = held{local: p.DbgUpvalues[b]}
					continue
				}
			case lua.OP_GETGLOBAL:
				if g := p.Constants[int(p.Code[pc]&0x3ffff)].String(); g == "table" || mutators[g] {
					regs[a] = held{fn: g}
					continue
				}
			case lua.OP_MOVE, lua.OP_MOVEN:
				if h, ok := regs[b]; ok {
					regs[a] = h
					continue
				}
			case lua.OP_GETTABLE, lua.OP_GETTABLEKS:
				if h, ok := regs[b]; ok {
					switch {
					case h.local != "":
						regs[a] = h // a table in the chunk's table is the chunk's too
						continue
					case h.fn == "table" && mutators["table."+constant(c)]:
						regs[a] = held{fn: "table." + constant(c)}
						continue
					}
				}
			case lua.OP_SETTABLE, lua.OP_SETTABLEKS:
				if h := regs[a]; h.local != "" {
					out = append(out, h.local+"[...]")
				}
			case lua.OP_CALL, lua.OP_TAILCALL:
				if mutators[regs[a].fn] && regs[a+1].local != "" {
					out = append(out, regs[a+1].local+"[...]")
				}
			}
			delete(regs, a) // A is written by most instructions
		}
	}
	walk(proto, true, nil)
	slices.Sort(out)
	return slices.Compact(out)
}

// TestLibUnitsParseAlone: luaUnits splits each lib file into statements
// that parse on their own and together are the file, so that needed
// leaves out whole statements only.
func TestLibUnitsParseAlone(t *testing.T) {
	libs, err := fs.Glob(luaFiles, "lua/lib/*.lua")
	if err != nil || len(libs) == 0 {
		t.Fatal(libs, err)
	}
	for _, name := range libs {
		lib := readLua(name)
		var whole strings.Builder
		for _, u := range luaUnits(lib.body) {
			whole.WriteString(u.text)
			if _, err := parse.Parse(strings.NewReader(u.text), name); err != nil {
				t.Errorf("%s: a statement does not parse alone (start a statement at column 0, indent what goes on): %v\n%s", name, err, u.text)
			}
		}
		if whole.String() != lib.body {
			t.Errorf("%s: its statements are not the file", name)
		}
	}
}

// TestNeededLeavesOutWhatNothingCalls: a local function or value is kept
// when the script or a statement kept names it; code and values made by a
// call always run.
func TestNeededLeavesOutWhatNothingCalls(t *testing.T) {
	lib := luaFile{name: "lib/x.lua", body: `--[[ x: a lib
mentions unused() in its comment
]]
local function unused() return 1 end

local function helper() return 2 end
-- used calls helper
local function used()
  return helper()
end
local TABLE = {
  a = 1,
}
local CALLED = tostring(3)
local mark = redis.call('GET', K.layout)
if mark then
  return 0
end
`}
	got := needed([]luaFile{lib}, "-- TABLE is not used\nreturn used()\n")
	for _, want := range []string{"local function used()", "local function helper()", "local CALLED = tostring(3)", "local mark = redis.call", "if mark then"} {
		if !strings.Contains(got, want) {
			t.Errorf("left out %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"local function unused()", "local TABLE"} {
		if strings.Contains(got, not) {
			t.Errorf("kept %q:\n%s", not, got)
		}
	}
}

// compileLua compiles src as Lua 5.1 (gopher-lua), failing the test when
// it does not parse or compile.
func compileLua(t *testing.T, name, src string) *lua.FunctionProto {
	t.Helper()
	chunk, err := parse.Parse(strings.NewReader(src), name)
	if err != nil {
		t.Fatalf("%s does not parse: %v", name, err)
	}
	proto, err := lua.Compile(chunk, name)
	if err != nil {
		t.Fatalf("%s does not compile: %v", name, err)
	}
	return proto
}

// luaGlobals compiles src as Lua 5.1 and returns the globals it reads and
// writes.
func luaGlobals(t *testing.T, name, src string) (reads, writes []string) {
	t.Helper()
	proto := compileLua(t, name, src)
	var walk func(p *lua.FunctionProto)
	walk = func(p *lua.FunctionProto) {
		for _, inst := range p.Code {
			op, bx := int(inst>>26), int(inst&0x3ffff) // gopher-lua's instruction format: opcode in the top 6 bits, Bx in the low 18
			switch op {
			case lua.OP_GETGLOBAL:
				reads = append(reads, p.Constants[bx].String())
			case lua.OP_SETGLOBAL:
				writes = append(writes, p.Constants[bx].String())
			}
		}
		for _, child := range p.FunctionPrototypes {
			walk(child)
		}
	}
	walk(proto)
	slices.Sort(reads)
	slices.Sort(writes)
	return slices.Compact(reads), slices.Compact(writes)
}

// TestEveryFunctionLoads loads every function form, of each layout, into a
// real Redis: one that Redis refuses (an upvalue too many, a call at load)
// would leave its script to run as a script, its saving lost.
func TestEveryFunctionLoads(t *testing.T) {
	rdb := testenv.Redis(t).Client()
	for _, f := range functionForms(t) {
		if err := rdb.FunctionLoad(context.Background(), f.fn.code).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Errorf("%s (layout %d): FUNCTION LOAD: %v", f.name, f.layout, err)
		}
	}
}
