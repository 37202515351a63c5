package prom_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/capture/wal"
	"github.com/watermill-outbox/outbox/metrics/prom"
)

// TestDashboardQueriesExportedMetrics: every outbox_* series and every label that the Grafana
// dashboard (metrics/grafana/outbox-relay.json) queries is one that the Recorder exports.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	r.Delivered("t", time.Second)
	r.Failed("t")
	r.DeadLettered("t")
	r.Unavailable("t")
	r.DestinationUnavailable("d", true)
	r.DestinationCall("d", time.Millisecond, true)
	r.Backlog(outbox.Backlog{})
	r.Subscriptions(1, 1)
	r.Written("t", false)
	r.Written("t", true)
	r.WriteInvalid("topic")
	r.WriteCall(time.Millisecond, "ok")
	// The WAL source's collector (package capture/wal): a Source on a pool that never connects.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	src, err := wal.New(pool, wal.Config{Tables: []capture.Table{{Name: "t"}}, Destination: gochannel.NewGoChannel(gochannel.Config{}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(wal.NewCollector(src))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]map[string]bool{} // series name → labels
	for _, mf := range mfs {
		names := []string{mf.GetName()}
		if mf.GetType().String() == "HISTOGRAM" {
			names = []string{mf.GetName() + "_bucket", mf.GetName() + "_sum", mf.GetName() + "_count"}
		}
		for _, n := range names {
			labels := map[string]bool{"job": true, "instance": true} // added by the scrape
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = true
				}
			}
			if strings.HasSuffix(n, "_bucket") {
				labels["le"] = true
			}
			exported[n] = labels
		}
	}

	raw, err := os.ReadFile("../grafana/outbox-relay.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	selector := regexp.MustCompile(`(outbox_[a-z_]+)(\{([^}]*)\})?`)
	byClause := regexp.MustCompile(`by \(([^)]*)\)`)
	queried := 0
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			var names []string
			for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				labels, ok := exported[m[1]]
				if !ok {
					t.Errorf("panel %q queries %s, which is not exported", p.Title, m[1])
					continue
				}
				queried++
				names = append(names, m[1])
				for _, matcher := range strings.Split(m[3], ",") {
					if l := strings.TrimSpace(strings.FieldsFunc(matcher, func(r rune) bool { return r == '=' || r == '!' || r == '~' })[0:1][0]); matcher != "" && !labels[l] {
						t.Errorf("panel %q filters %s on label %q, which it does not have", p.Title, m[1], l)
					}
				}
			}
			for _, m := range byClause.FindAllStringSubmatch(tg.Expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					for _, n := range names {
						if l = strings.TrimSpace(l); !exported[n][l] {
							t.Errorf("panel %q groups %s by %q, which it does not have", p.Title, n, l)
						}
					}
				}
			}
		}
	}
	if queried < 10 {
		t.Fatalf("only %d outbox series found in the dashboard's queries", queried)
	}
}
