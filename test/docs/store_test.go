package docs

import (
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// docs/store.md describes the Redis layout: every key builder of
// store.Keys (pkg/store/keys.go) and every Lua file of pkg/store/lua and
// pkg/store/lua/lib is named there, so that a key or a script added
// without a word in it fails here instead of leaving the page silently
// behind. The page's redis-cli toolbox and its scores use the hold band's
// width, and it says which layout it describes: both must be the code's.
func TestStoreMdNamesEveryKeyAndScript(t *testing.T) {
	page := read(t, "docs/store.md")

	keys := reflect.TypeOf(store.Keys{})
	if keys.NumMethod() < 10 {
		t.Fatalf("store.Keys has only %d exported methods", keys.NumMethod())
	}
	for i := 0; i < keys.NumMethod(); i++ {
		name := "Keys." + keys.Method(i).Name
		if !strings.Contains(page, "`"+name+"`") {
			t.Errorf("docs/store.md does not name `%s` (pkg/store/keys.go): add the key to its tables", name)
		}
	}

	var files []string
	for _, dir := range []string{"pkg/store/lua", "pkg/store/lua/lib"} {
		m, err := filepath.Glob(filepath.Join(root(t), dir, "*.lua"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			files = append(files, dir+"/"+filepath.Base(f))
		}
	}
	if len(files) < 20 {
		t.Fatalf("found only %d Lua files in pkg/store/lua", len(files))
	}
	for _, f := range files {
		if !strings.Contains(page, "(../"+f+")") {
			t.Errorf("docs/store.md does not link %s: add it to the index of the Lua scripts (and to the moves it makes)", f)
		}
	}

	if band := strconv.FormatInt(store.HoldBand, 10); !strings.Contains(page, band) {
		t.Errorf("docs/store.md does not give store.HoldBand, %s, which its toolbox and its scores use", band)
	}
	if l := "**layout " + strconv.Itoa(store.LayoutNewest) + "**"; !strings.Contains(page, l) {
		t.Errorf("docs/store.md does not say it describes %s (store.LayoutNewest): describe the newest layout", l)
	}
}
