// racy has a data race: two goroutines write n without synchronisation.
// TestRaceReportFindsADataRace builds it with -race.
package main

import "fmt"

func main() {
	n := 0
	done := make(chan bool)
	go func() { n++; done <- true }()
	n++
	<-done
	fmt.Println(n)
}
