package main

import (
	"path/filepath"
	"testing"
)

// TestWebhookPermanentStatusFlag: --webhook-permanent-status reaches webhook.Config: a status
// the webhook refuses as permanent (503 means unavailable) fails the relay with one line
// naming the flag.
func TestWebhookPermanentStatusFlag(t *testing.T) {
	db := "sqlite://" + filepath.Join(t.TempDir(), "outbox.db")
	mustRun(t, nil, "migrate", "--db", db)
	wantFailure(t, cli(t, nil, "relay", "--db", db, "--to", "http://127.0.0.1:9/hook", "--allow-prefix", "127.0.0.0/8",
		"--webhook-permanent-status", "410", "--webhook-permanent-status", "503"), 1,
		"--webhook-permanent-status", "503 means the receiver is unavailable")
}
