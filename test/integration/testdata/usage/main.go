// Command usage is an instance for the instance metrics tests:
//
//	usage mem MB    allocates and touches MB MiB, writes a 2 MiB file "ballast" in its
//	                working directory, prints "ready" and sleeps until killed
//	usage spin      keeps one core busy until killed
//	usage cat FILE  prints FILE (for exec in a container whose rootfs has no cat)
//	usage env       prints its environment, one variable a line
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

var keep []byte

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: usage mem MB | spin | cat FILE | env")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "mem":
		mb, err := strconv.Atoi(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		keep = make([]byte, mb<<20)
		for i := range keep {
			keep[i] = byte(i)
		}
		if err := os.WriteFile("ballast", make([]byte, 2<<20), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("ready")
		for {
			time.Sleep(time.Hour)
			keep[0]++
		}
	case "cat":
		b, err := os.ReadFile(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
		os.Exit(0)
	case "env":
		for _, kv := range os.Environ() {
			fmt.Println(kv)
		}
		os.Exit(0)
	case "spin":
		fmt.Println("spinning")
		n := 0
		for {
			n++
		}
	}
	os.Exit(2)
}
