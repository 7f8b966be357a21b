package store

import (
	"fmt"
	"os"
	"strconv"
)

// DELAYBRIDGE_TEST_LAYOUT runs the package's tests with another layout
// for the stores they make (Makefile's unit target runs them in each).
func init() {
	v := os.Getenv("DELAYBRIDGE_TEST_LAYOUT")
	if v == "" {
		return
	}
	l, err := strconv.Atoi(v)
	if err != nil || l < Layout1 || l > LayoutNewest {
		panic(fmt.Sprintf("DELAYBRIDGE_TEST_LAYOUT=%q: want %d to %d", v, Layout1, LayoutNewest))
	}
	newLayout = l
}

// LayoutOfTests is the layout the package's tests give a new store
// (DELAYBRIDGE_TEST_LAYOUT, else LayoutNew).
func LayoutOfTests() int { return newLayout }
