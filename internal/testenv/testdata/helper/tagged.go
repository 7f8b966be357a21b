//go:build testenvtag

package main

import "fmt"

// Built only with -tags testenvtag, for the test of BuildPackageTagged.
func init() { fmt.Println("built with testenvtag") }
