package store

import (
	"io/fs"
	"path"
	"slices"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"
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
		}
	}
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

// luaGlobals compiles src as Lua 5.1 and returns the globals it reads and
// writes.
func luaGlobals(t *testing.T, name, src string) (reads, writes []string) {
	t.Helper()
	chunk, err := parse.Parse(strings.NewReader(src), name)
	if err != nil {
		t.Fatalf("%s does not parse: %v", name, err)
	}
	proto, err := lua.Compile(chunk, name)
	if err != nil {
		t.Fatalf("%s does not compile: %v", name, err)
	}
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
