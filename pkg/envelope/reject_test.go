package envelope

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"slices"
	"strconv"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/destination"
)

// TestRejectCodesListsEveryCode binds the hand-kept RejectCodes to the Code
// constants declared in reject.go: a code added there and not listed would
// have no pre-made metric series and no request field in pkg/ops.
func TestRejectCodesListsEveryCode(t *testing.T) {
	f, err := goparser.ParseFile(token.NewFileSet(), "reject.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok {
					t.Fatalf("a Code constant's value is not a string literal: %T", v)
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				declared = append(declared, s)
			}
		}
	}
	if len(declared) == 0 {
		t.Fatal("found no Code constants in reject.go")
	}
	var listed []string
	for _, c := range RejectCodes {
		if slices.Contains(listed, string(c)) {
			t.Errorf("RejectCodes lists %q twice", c)
		}
		listed = append(listed, string(c))
	}
	slices.Sort(declared)
	slices.Sort(listed)
	listed = slices.Compact(listed)
	for _, c := range declared {
		if !slices.Contains(listed, c) {
			t.Errorf("Code %q is declared in reject.go but not in RejectCodes", c)
		}
	}
	for _, c := range listed {
		if !slices.Contains(declared, c) {
			t.Errorf("RejectCodes lists %q, which reject.go does not declare as a Code constant", c)
		}
	}
}

// The reason of a reserved destination and its reject code are one word.
func TestDestinationReservedIsOneWord(t *testing.T) {
	if string(CodeDestinationReserved) != destination.ReservedCode {
		t.Fatalf("CodeDestinationReserved %q, destination.ReservedCode %q", CodeDestinationReserved, destination.ReservedCode)
	}
}
