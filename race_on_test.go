//go:build race

package outbox_test

// raceEnabled reports a -race build: SQLite (modernc.org/sqlite, C translated to Go) runs
// tens of times slower under the race detector, so SQLite subtests use smaller loads.
const raceEnabled = true
