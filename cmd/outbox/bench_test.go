package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestBench runs `outbox bench` small on each backend: every row of the table is printed with
// positive figures, and the bench tables are gone afterwards.
func TestBench(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, _ := b.fresh(t)
			out := mustRun(t, nil, "bench", "--db", db, "--events", "1500", "--rounds", "2", "--tx", "100", "--writers", "4", "--rate", "100", "--duration", "2s")
			rows := map[string]*regexp.Regexp{
				"write path": regexp.MustCompile(`(?m)^write path, 4 writers \(tx/s\)\s+(\d+)\s+(\d+)\s+([\d.]+)$`),
				"unordered":  regexp.MustCompile(`(?m)^drain unordered \(events/s\)\s+(\d+)\s+(\d+)\s+([\d.]+)$`),
				"1,000 keys": regexp.MustCompile(`(?m)^drain 1,000 keys \(events/s\)\s+(\d+)\s+(\d+)\s+([\d.]+)$`),
				"hot keys":   regexp.MustCompile(`(?m)^drain 10 hot keys \(events/s\)\s+(\d+)\s+(\d+)\s+([\d.]+)$`),
				"latency":    regexp.MustCompile(`(?m)^latency at 100/s, 100 keys, p50/p99/worst \(ms\)\s+([\d.]+)/([\d.]+)/([\d.]+)$`),
				"held drain": regexp.MustCompile(`(?m)^drain 10 hot keys, held snapshot \(events/s\)\s+(\d+)\s+(\d+)\s+([\d.]+)$`),
				"held":       regexp.MustCompile(`(?m)^  with a held snapshot \(ms\)\s+([\d.]+)/([\d.]+)/([\d.]+)\s+p99 ratio\s+([\d.]+)$`),
				"rss":        regexp.MustCompile(`(?m)^peak RSS after the drains \(MiB\)\s+(\d+)$`),
			}
			for name, re := range rows {
				m := re.FindStringSubmatch(out)
				if m == nil {
					t.Fatalf("no %s row in:\n%s", name, out)
				}
				for _, v := range m[1:] {
					if f, err := strconv.ParseFloat(v, 64); err != nil || f <= 0 {
						t.Errorf("%s row: figure %q is not positive: %s", name, v, m[0])
					}
				}
			}
			prefix := regexp.MustCompile(`tables (outbox_bench_[0-9a-f]+)_\*`).FindStringSubmatch(out)
			if prefix == nil {
				t.Fatalf("no table prefix in %s", out)
			}
			var left int
			q := `SELECT count(*) FROM pg_tables WHERE tablename LIKE '` + prefix[1] + `%'`
			switch b.name {
			case "sqlite":
				q = `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE '` + prefix[1] + `%'`
			case "mariadb": // the key-lock tables <table>_keys included
				q = `SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE '` + prefix[1] + `%'`
			}
			u, _ := parseDBURL(db)
			d, err := openDB(t.Context(), u, "x", openOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.pool != nil {
				err = d.pool.QueryRow(t.Context(), q).Scan(&left)
			} else {
				err = d.sqlDB.QueryRowContext(t.Context(), q).Scan(&left)
			}
			if err != nil || left != 0 {
				t.Fatalf("%d bench tables left (%v)", left, err)
			}
			if !strings.Contains(out, "2 rounds (medians), 1500 events per drain") {
				t.Fatalf("header: %s", out)
			}
		})
	}
}

// TestBenchWindows: --windows prints every 10 s window of a latency run, with the run's
// events in it (a 2 s run at 100 events/s: one window of 200 events).
func TestBenchWindows(t *testing.T) {
	ran := false
	for _, b := range backends() {
		if b.name != "sqlite" {
			continue
		}
		ran = true
		db, _ := b.fresh(t)
		out := mustRun(t, nil, "bench", "--db", db, "--only", "latency", "--held-snapshot=false", "--windows", "--rate", "100", "--duration", "2s", "--writers", "2")
		m := regexp.MustCompile(`(?m)^\s+0:\s+(\d+)\s+([\d.]+)/([\d.]+)/([\d.]+)$`).FindStringSubmatch(out)
		if m == nil || m[1] != "200" {
			t.Fatalf("want one window of 200 events in:\n%s", out)
		}
		if !strings.Contains(out, "latency windows (s from start: events, p50/p99/max ms)") {
			t.Fatalf("no windows heading in:\n%s", out)
		}
	}
	if !ran {
		t.Fatal("no sqlite backend")
	}
}
