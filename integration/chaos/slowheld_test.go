package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// heldDescriber is a backend that can describe the events a relay holds, for the report of
// a kill whose held events came late (PostgreSQL).
type heldDescriber interface {
	// describeHeld maps each event leased by relay to its state: ordering key, sequence,
	// lease left, attempts, delivery starts, whether it is due, and the token.
	describeHeld(ctx context.Context, table, relay string) (map[string]string, error)
}

func (b *pgBackend) describeHeld(ctx context.Context, table, relay string) (map[string]string, error) {
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`SELECT id::text, format('key=%%s seq=%%s lease_left_s=%%s attempts=%%s starts=%%s next_in_s=%%s token=%%s',
		ordering_key, sequence, round(extract(epoch FROM lease_until - now())::numeric, 2), attempts, delivery_starts,
		round(extract(epoch FROM next_attempt_at - now())::numeric, 2), leased_by)
		FROM %q WHERE published_at IS NULL AND dead_lettered_at IS NULL AND starts_with(leased_by, $1)`, table), relay+"#")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var id, desc string
	_, err = pgx.ForEachRow(rows, []any{&id, &desc}, func() error { out[id] = desc; return nil })
	return out, err
}

// slowHeldReport describes each kill whose held events were not all delivered within bound
// of the restart: the late events (at most 5) with their state at the kill and their
// deliveries, and the restarted relay's log lines (no debug) from its start to the last late
// delivery. For diagnosis only; the targets are judged elsewhere.
func slowHeldReport(ds []delivery, kills, restarts []time.Time, held [][]string, states []map[string]string,
	names []string, logs *relayLogs, bound time.Duration) []string {
	var out []string
	for i, ids := range held {
		want := make(map[string]bool, len(ids))
		for _, id := range ids {
			want[id] = true
		}
		first := map[string]time.Time{}
		for _, d := range ds {
			if want[d.id] && !d.at.Before(kills[i]) {
				if _, ok := first[d.id]; !ok {
					first[d.id] = d.at
				}
			}
		}
		var late []string
		var lastLate time.Time
		for _, id := range ids {
			if at, ok := first[id]; ok && at.Sub(restarts[i]) > bound {
				late = append(late, id)
				lastLate = maxTime(lastLate, at)
			}
		}
		if len(late) == 0 {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "kill %d of %s: %d of %d held events delivered more than %s after the restart (last %.2f s after)\n",
			i+1, names[i], len(late), len(ids), bound, lastLate.Sub(restarts[i]).Seconds())
		for j, id := range late {
			if j == 5 {
				break
			}
			fmt.Fprintf(&b, "  %s at kill: %s; first delivery after kill at +%.2f s from restart\n", id, states[i][id], first[id].Sub(restarts[i]).Seconds())
		}
		lines := logs.between(names[i], restarts[i], lastLate)
		if len(lines) > 30 {
			lines = lines[:30]
		}
		for _, l := range lines {
			if len(l) > 300 {
				l = l[:300] + "…"
			}
			fmt.Fprintf(&b, "  | %s\n", l)
		}
		out = append(out, b.String())
	}
	return out
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
