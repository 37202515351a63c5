package engine

import "testing"

// TestEagerClaimPolicy: with the default policy a subscription locks eagerly (SQLite) while
// its waits end with wakeup signals, for at most maxEagerFullRun whole batches in a row, and
// never before a wakeup or after a wait that ran out.
func TestEagerClaimPolicy(t *testing.T) {
	sub := &subscription{s: &Relay{}}
	if sub.eagerClaim() {
		t.Fatal("eager before any wakeup")
	}
	sub.woken = true
	for i := range 3 {
		if !sub.eagerClaim() {
			t.Fatalf("claim %d after a wakeup not eager", i)
		}
	}
	sub.fullRun = maxEagerFullRun - 1
	if !sub.eagerClaim() {
		t.Fatalf("not eager after %d whole batches", sub.fullRun)
	}
	sub.fullRun = maxEagerFullRun
	if sub.eagerClaim() {
		t.Fatalf("eager after %d whole batches in a row", sub.fullRun)
	}
	sub.fullRun, sub.woken = 0, false
	if sub.eagerClaim() {
		t.Fatal("eager after a wait that ran out")
	}
}
