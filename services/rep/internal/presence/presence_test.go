package presence

import (
	"testing"
	"time"
)

func TestLapseAfter(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		10 * time.Second: 10 * time.Second * 2 / 3, // a renewal (every 3.3 s) gone unanswered
		30 * time.Second: 20 * time.Second,
		3 * time.Second:  2500 * time.Millisecond, // short TTLs keep a margin over the renewal interval
		2 * time.Second:  2*time.Second/3 + 1500*time.Millisecond,
	} {
		if got := lapseAfter(ttl); got != want {
			t.Errorf("lapseAfter(%s) = %s, want %s", ttl, got, want)
		}
	}
}
