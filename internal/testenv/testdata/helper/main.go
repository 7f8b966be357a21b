// Command helper is a tiny program for testenv's own tests of BuildPackage and
// StartProcess: it prints "ready", then exits with code 3 on SIGTERM, or with the code
// given as its first argument after printing it, if any.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

func main() {
	if len(os.Args) > 1 {
		code, _ := strconv.Atoi(os.Args[1])
		fmt.Println("exiting with", code)
		os.Exit(code)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	fmt.Println("ready")
	<-sigs
	fmt.Fprintln(os.Stderr, "got SIGTERM")
	os.Exit(3)
}
