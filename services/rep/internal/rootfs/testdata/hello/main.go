// Command hello is the static binary put in the test images: it prints a greeting and its
// arguments.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	fmt.Println("hello from the image", strings.Join(os.Args[1:], " "))
}
