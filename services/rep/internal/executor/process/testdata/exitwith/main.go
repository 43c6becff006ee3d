// Command exitwith prints its arguments after the first to stderr, one per line, and exits
// with the status given as the first argument.
package main

import (
	"fmt"
	"os"
	"strconv"
)

func main() {
	code, _ := strconv.Atoi(os.Args[1])
	for _, a := range os.Args[2:] {
		fmt.Fprintln(os.Stderr, a)
	}
	os.Exit(code)
}
