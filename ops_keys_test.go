package outbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
)

// TestKeyHeadActions: on every backend, BlockedKeys lists a key behind a failed head, one
// behind a dead-lettered head and one behind a failed head in flight; RetryKeyHead,
// SkipKeyHead and PurgeKeyHead act only on the head they name while it is still the key's
// failed head and not in flight, and answer ErrHeadMoved otherwise; the dead-letter filters by
// key and error text find the skipped head; RelayLeases shows the lease in flight.
func TestKeyHeadActions(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		for i, k := range []string{"a", "a", "a", "b", "b", "c", "c"} {
			b.publishKeys(t, schema, "t."+k, i, []string{k})
		}
		q := fmt.Sprintf("%q", schema.Table)
		// a: head failed once; b: head dead-lettered; c: head failed but leased (in flight).
		b.exec(t, `UPDATE `+q+` SET attempts = 1, last_error = 'e-a', next_attempt_at = `+b.at(time.Hour)+` WHERE sequence = 1`)
		b.exec(t, `UPDATE `+q+` SET attempts = 5, last_error = 'e-b', dead_lettered_at = `+b.at(0)+` WHERE sequence = 4`)
		b.exec(t, `UPDATE `+q+` SET attempts = 1, last_error = 'e-c', next_attempt_at = `+b.at(0)+`, lease_until = `+b.at(time.Minute)+`, leased_by = 'r#000000000000#1' WHERE sequence = 6`)
		sub := b.newSub(t, outbox.SubscriberConfig{Schema: schema})
		ks, err := sub.BlockedKeys(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		type row struct {
			key  string
			seq  int64
			held int64
			dead bool
			err  string
		}
		var got []row
		for _, k := range ks {
			got = append(got, row{k.Key, k.Head.Sequence, k.Held, k.Dead(), k.Head.LastError})
		}
		want := []row{{"a", 1, 2, false, "e-a"}, {"b", 4, 1, true, "e-b"}, {"c", 6, 1, false, "e-c"}}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Fatalf("BlockedKeys = %+v, want %+v", got, want)
		}
		if ks[0].Head.Topic != "t.a" || ks[0].NextAttemptAt.IsZero() || ks[1].DeadLetteredAt.IsZero() || ks[0].Now.IsZero() {
			t.Errorf("BlockedKeys a: %+v, b: %+v; want topic, next attempt, dead time and clock", ks[0], ks[1])
		}
		if lr, err := sub.RelayLeases(ctx, 10); err != nil || lr.Capped || len(lr.Relays) != 1 || lr.Relays[0].Relay != "r" ||
			lr.Relays[0].Instance != "r#000000000000" || lr.Relays[0].Events != 1 {
			t.Errorf("RelayLeases = %+v, %v; want relay r holding 1 event", lr, err)
		}
		if err := sub.SkipKeyHead(ctx, outbox.KeyHead{Key: "a", Sequence: 2}); !errors.Is(err, outbox.ErrHeadMoved) {
			t.Errorf("skip of a non-head: %v, want ErrHeadMoved", err)
		}
		if err := sub.PurgeKeyHead(ctx, outbox.KeyHead{Key: "c", Sequence: 6}); !errors.Is(err, outbox.ErrHeadMoved) {
			t.Errorf("purge of a head in flight: %v, want ErrHeadMoved", err)
		}
		if err := sub.RetryKeyHead(ctx, outbox.KeyHead{Key: "b", Sequence: 4}); err != nil {
			t.Fatal(err)
		}
		if err := sub.RetryKeyHead(ctx, outbox.KeyHead{Key: "b", Sequence: 4}); !errors.Is(err, outbox.ErrHeadMoved) {
			t.Errorf("second retry of a retried head: %v, want ErrHeadMoved", err)
		}
		if err := sub.PurgeKeyHead(ctx, outbox.KeyHead{Key: "a", Sequence: 1}); err != nil {
			t.Fatal(err)
		}
		rs, err := b.raw.QueryContext(ctx, `SELECT sequence, attempts, CASE WHEN dead_lettered_at IS NULL THEN 0 ELSE 1 END,
	CASE WHEN next_attempt_at IS NOT NULL AND next_attempt_at <= `+b.at(0)+` THEN 1 ELSE 0 END FROM `+q+` WHERE sequence <= 5 ORDER BY sequence`)
		if err != nil {
			t.Fatal(err)
		}
		var state []string
		for rs.Next() {
			var seq, attempts, dead, due int
			if err := rs.Scan(&seq, &attempts, &dead, &due); err != nil {
				t.Fatal(err)
			}
			state = append(state, fmt.Sprintf("%d:%d:%v:%v", seq, attempts, dead == 1, due == 1))
		}
		rs.Close()
		// 1 purged; 2 (a's next) due now; 4 retried: fresh attempts, due now.
		if got, want := strings.Join(state, " "), "2:0:false:true 3:0:false:false 4:0:false:true 5:0:false:false"; got != want {
			t.Errorf("after retry b and purge a: %q, want %q", got, want)
		}
		// c's lease runs out: its head can be skipped, and the dead-letter filters find it.
		b.exec(t, `UPDATE `+q+` SET lease_until = `+b.at(-time.Minute)+` WHERE sequence = 6`)
		if err := sub.SkipKeyHead(ctx, outbox.KeyHead{Key: "c", Sequence: 6}); err != nil {
			t.Fatal(err)
		}
		for _, f := range []outbox.DeadLetterFilter{{Topics: []string{"*"}, Key: "c"}, {Topics: []string{"t.*"}, ErrorContains: "E-C"},
			{Topics: []string{"*"}, DeadAfter: time.Now().Add(-time.Hour), Key: "c"}} {
			if n, err := sub.CountDeadLettered(ctx, f); err != nil || n != 1 {
				t.Errorf("CountDeadLettered(%+v) = %d, %v; want 1 (the skipped head)", f, n, err)
			}
		}
		if ks, err := sub.BlockedKeys(ctx, 10); err != nil || len(ks) != 0 {
			t.Errorf("BlockedKeys at the end = %+v, %v; want none", ks, err)
		}
		if err := sub.RetryKeyHead(ctx, outbox.KeyHead{}); !errors.Is(err, outbox.ErrConfig) {
			t.Errorf("empty key: %v, want a ConfigError", err)
		}
		if _, err := sub.BlockedKeys(ctx, 0); !errors.Is(err, outbox.ErrConfig) {
			t.Errorf("limit 0: %v, want a ConfigError", err)
		}
		if _, err := sub.RelayLeases(ctx, 0); !errors.Is(err, outbox.ErrConfig) {
			t.Errorf("RelayLeases limit 0: %v, want a ConfigError", err)
		}
		if _, err := sub.CountDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}, DeadAfter: time.Now(), DeadBefore: time.Now().Add(-time.Hour)}); !errors.Is(err, outbox.ErrConfig) {
			t.Errorf("DeadBefore before DeadAfter: %v, want a ConfigError", err)
		}
	})
}
