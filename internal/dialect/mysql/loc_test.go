package mysql

import (
	"database/sql"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// TestTimesIgnoreDriverLoc: through a handle with parseTime=true and loc=Europe/Berlin, times
// stored in UTC come back unchanged, also a wall clock inside Berlin's daylight-saving gap
// (2026-03-29 02:30, which does not exist in Berlin: a driver-parsed time came back as 03:30).
func TestTimesIgnoreDriverLoc(t *testing.T) {
	needDB(t)
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=Europe%2FBerlin")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tb := newTable(t)
	out := mustInsert(t, tb, ev("t", `1`, "", ""))
	exec(t, "UPDATE "+namesOf(tb).table+" SET created_at = '2026-03-29 02:30:00.000000', dead_lettered_at = '2026-03-29 02:45:00.000000', attempts = 1 WHERE sequence = ?", out[0].Sequence)
	dead, err := New().ListDead(t.Context(), sqlEx(db), tb, dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	wantCreated, wantDead := time.Date(2026, 3, 29, 2, 30, 0, 0, time.UTC), time.Date(2026, 3, 29, 2, 45, 0, 0, time.UTC)
	if len(dead) != 1 || !dead[0].CreatedAt.Equal(wantCreated) || !dead[0].DeadLetteredAt.Equal(wantDead) {
		t.Fatalf("dead letters %+v, want created_at %v, dead_lettered_at %v", dead, wantCreated, wantDead)
	}
}
