package testkit

import (
	"crypto/rand"
	"fmt"
	"net"
	"testing"
)

// FreeSubnet picks a random /24 in 10.<second>.0.0/16 that no address on this host is in, so
// that tests creating CNI bridges (and test runs side by side on one machine) do not share a
// network. It returns the subnet and its third octet (for a bridge name unique to it).
func FreeSubnet(t testing.TB, second byte) (subnet string, third byte) {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		b := make([]byte, 1)
		_, _ = rand.Read(b)
		_, sub, _ := net.ParseCIDR(fmt.Sprintf("10.%d.%d.0/24", second, b[0]))
		used := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && (sub.Contains(ipn.IP) || ipn.Contains(sub.IP)) {
				used = true
			}
		}
		if !used {
			return sub.String(), b[0]
		}
	}
	t.Fatalf("no free /24 in 10.%d.0.0/16", second)
	return "", 0
}
