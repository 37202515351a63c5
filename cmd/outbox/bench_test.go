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
			q := map[string]string{
				"postgres": `SELECT count(*) FROM pg_tables WHERE tablename LIKE '` + prefix[1] + `%'`,
				"sqlite":   `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE '` + prefix[1] + `%'`,
				// the key-lock tables <table>_keys included
				"mariadb": `SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE '` + prefix[1] + `%'`,
			}[b.name]
			u, _ := parseDBURL(db)
			d, err := openDB(t.Context(), u, "x", openOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			n, err := d.Int(t.Context(), q)
			left = int(n)
			if err != nil || left != 0 {
				t.Fatalf("%d bench tables left (%v)", left, err)
			}
			if !strings.Contains(out, "2 rounds (medians), 1500 events per drain") {
				t.Fatalf("header: %s", out)
			}
			checkBenchColumns(t, out)
		})
	}
}

// benchCell is one cell of a bench table row: a run of text whose words are one space apart,
// cells being two or more spaces apart.
var benchCell = regexp.MustCompile(`\S+(?: \S+)*`)

// checkBenchColumns checks that the result table of a bench output lines up: in every row
// after the "measure" header, each figure ends where its column's header ends.
func checkBenchColumns(t *testing.T, out string) {
	t.Helper()
	_, table, ok := strings.Cut(out, "\nmeasure ")
	if !ok {
		t.Fatalf("no table in:\n%s", out)
	}
	lines := strings.Split(strings.TrimRight("measure "+table, "\n"), "\n")
	var ends []int
	for _, m := range benchCell.FindAllStringIndex(lines[0], -1)[1:] {
		ends = append(ends, m[1])
	}
	if len(ends) != 3 {
		t.Fatalf("header %q: want 3 columns after the first", lines[0])
	}
	for _, l := range lines[1:] {
		cells := benchCell.FindAllStringIndex(l, -1)
		if len(cells) < 2 || len(cells) > 4 {
			t.Errorf("row %q: %d cells", l, len(cells))
			continue
		}
		for i, c := range cells[1:] {
			if c[1] != ends[i] {
				t.Errorf("misaligned row: column %d ends at %d, its header at %d:\n%s\n%s", i+2, c[1], ends[i], lines[0], l)
			}
		}
	}
}

// TestBenchOneRound: a one-round bench says "1 round", and its table lines up, the latency
// rows (wider figures, a longer title) included.
func TestBenchOneRound(t *testing.T) {
	db, _ := sqliteBackend().fresh(t)
	out := mustRun(t, nil, "bench", "--db", db, "--events", "300", "--rounds", "1", "--tx", "50", "--writers", "2", "--rate", "100", "--duration", "1s")
	if !strings.Contains(out, ", 1 round (medians), 300 events per drain\n") {
		t.Fatalf("header: %s", out)
	}
	if !regexp.MustCompile(`(?m)^  with a held snapshot \(ms\)`).MatchString(out) {
		t.Fatalf("no held latency row in:\n%s", out)
	}
	checkBenchColumns(t, out)
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
