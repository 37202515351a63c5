package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/spf13/cobra"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
)

// benchFlags are the settings of `outbox bench`.
type benchFlags struct {
	db       string
	events   int
	rounds   int
	writers  int
	tx       int
	rate     float64
	duration time.Duration
	held     bool
	keep     bool
	only     []string
	latKeys  int
	shapes   []int
	windows  bool
	debug    bool
	heldOnly bool
}

func newBenchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench --db URL",
		Short: "Measure what the outbox sustains on this database, beside a raw loop",
		Long: `bench measures the outbox on the database given (PostgreSQL, MariaDB/MySQL or SQLite), in
tables of its own (created, then dropped), and prints one table:

  write path   transactions/s of --writers writers, each transaction a business INSERT plus one
               keyed event, beside the same INSERT plus one row into a plain events table;
  drain        events/s of one relay (BatchSize 1000) draining --events events, unordered,
               over 1,000 keys and over 10 hot keys, beside a raw loop that leases the oldest
               1,000 pending rows through an index of its own and marks them (order-blind, no
               retries, no dead letters);
  latency      commit → handler delay (p50, p99, and the worst p99 of any 10 s window) at --rate
               events/s over --latency-keys keys for --duration, relay woken in-process;
  held         with --held-snapshot, the drains and the latency run again with one idle
               transaction holding a snapshot taken before the events were written (a report
               query, a forgotten BEGIN, pg_dump or mysqldump: it keeps the row versions that
               leases and marks leave), beside the same without it;
  memory       the process's peak resident memory after the drains.

--only runs some of write, drain and latency; --drain-keys picks the drains' shapes; --windows
prints each 10 s window of the latency runs (a trend, or the moment of a stall, shows there);
--debug writes the relays' log to standard error at TRACE (every claim, with its duration).

Write path and drain alternate ours and the raw loop for --rounds rounds (the second round in
reverse order) on fresh tables and print medians and their ratio: one run's figures are only
comparable with each other. Run it on a database like production's, on a quiet machine.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for name, v := range map[string]int{"events": f.events, "rounds": f.rounds, "writers": f.writers, "tx": f.tx} {
				if v <= 0 {
					return badFlag(name, " must be positive")
				}
			}
			if f.rate <= 0 || f.duration <= 0 {
				return &usageError{errors.New("--rate and --duration must be positive")}
			}
			if f.latKeys < 0 || slices.ContainsFunc(f.shapes, func(k int) bool { return k < 0 }) {
				return &usageError{errors.New("--latency-keys and --drain-keys must not be negative")}
			}
			for _, m := range f.only {
				if m != "write" && m != "drain" && m != "latency" {
					return badFlag("only", fmt.Sprintf(": unknown measurement %q (write, drain, latency)", m))
				}
			}
			u, err := parseDBURL(f.db)
			if err != nil {
				return err
			}
			table := "outbox_bench_" + randomHex(4)
			// Ctrl-C or SIGTERM ends the run; runBench still drops its tables.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			d, err := openDB(ctx, u, table, openOptions{create: true})
			if err != nil {
				return err
			}
			defer d.Close()
			return runBench(ctx, cmd.OutOrStdout(), d, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.db, "db", "", "database URL: "+dbFlagForms+" (required)")
	markRequired(cmd, "db", "URL", dbFlagForms)
	fl.IntVar(&f.events, "events", 100000, "backlog of each drain")
	fl.IntVar(&f.rounds, "rounds", 3, "rounds of the write path and drains; medians are printed")
	fl.IntVar(&f.writers, "writers", 8, "concurrent writers of the write path and the latency run")
	fl.IntVar(&f.tx, "tx", 4000, "transactions of each write-path round")
	fl.Float64Var(&f.rate, "rate", 1000, "events per second of the latency run")
	fl.DurationVar(&f.duration, "duration", 30*time.Second, "length of each latency run")
	fl.BoolVar(&f.held, "held-snapshot", true, "run the drains and the latency test a second time with a snapshot held open")
	fl.StringSliceVar(&f.only, "only", []string{"write", "drain", "latency"}, "measurements to run: write, drain, latency")
	fl.IntVar(&f.latKeys, "latency-keys", 100, "ordering keys of the latency run's events (0: unordered)")
	fl.IntSliceVar(&f.shapes, "drain-keys", []int{0, 1000, 10}, "ordering keys of each drain's backlog (0: unordered)")
	fl.BoolVar(&f.keep, "keep", false, "keep the bench tables")
	fl.BoolVar(&f.windows, "windows", false, "print every 10 s window of the latency runs (events, p50, p99, max)")
	fl.BoolVar(&f.debug, "debug", false, "write the relays' log to standard error at TRACE")
	fl.BoolVar(&f.heldOnly, "held-latency-only", false, "run only the latency test with a held snapshot (diagnosis)")
	_ = fl.MarkHidden("held-latency-only")
	return withEnv(cmd)
}

// benchRun is one measurement: a name and its figure per round.
type benchRun struct {
	name   string
	unit   string
	ours   []float64
	theirs []float64
}

// humanInt writes n with thousands separators (1000 → "1,000").
func humanInt(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// bench holds what the measurements share.
type bench struct {
	ctx    context.Context
	d      *database
	f      benchFlags
	base   string // table name prefix
	tables []string
	seq    int
	out    io.Writer               // the table's writer (--windows lines too)
	logger watermill.LoggerAdapter // the relays' (--debug)
}

// table returns a fresh table name (dropped at the end unless --keep).
func (b *bench) table() string {
	b.seq++
	t := fmt.Sprintf("%s_%d", b.base, b.seq)
	b.tables = append(b.tables, t)
	return t
}

func (b *bench) schema(table string) outbox.SchemaConfig {
	return schemaFor(b.d.url, table)
}

func (b *bench) migrate(table string) (outbox.SchemaConfig, error) {
	s := b.schema(table)
	return s, outbox.Migrate(b.ctx, b.d.Handle(), s)
}

func runBench(ctx context.Context, out io.Writer, d *database, f benchFlags) error {
	b := &bench{ctx: ctx, d: d, f: f, base: d.tableName(), out: out, logger: watermill.NopLogger{}}
	if f.debug {
		b.logger = newSlogLogger(os.Stderr, true, true)
	}
	defer func() {
		if f.keep {
			return
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, t := range b.tables {
			_ = d.dropTables(cctx, d.OutboxTables(t)...)
		}
	}()
	fmt.Fprintf(out, "outbox bench: %s, tables %s_*, %s (medians), %d events per drain\n", d.where(), b.base, plural(int64(f.rounds), "round", "rounds"), f.events)

	var runs, heldRuns []*benchRun
	type shape struct {
		name string
		keys int
	}
	var shapes []shape
	for _, k := range f.shapes {
		switch k {
		case 0:
			shapes = append(shapes, shape{"unordered", 0})
		case 10:
			shapes = append(shapes, shape{"10 hot keys", 10})
		default:
			shapes = append(shapes, shape{fmt.Sprintf("%s keys", humanInt(k)), k})
		}
	}
	for _, sh := range shapes {
		if !slices.Contains(f.only, "drain") {
			break
		}
		r := &benchRun{name: "drain " + sh.name, unit: "events/s"}
		h := &benchRun{name: "drain " + sh.name + ", held snapshot", unit: "events/s"}
		for round := range f.rounds {
			steps := []func() error{
				func() error { v, err := b.drainOurs(sh.keys, false); r.ours = append(r.ours, v); return err },
				func() error { v, err := b.drainRaw(sh.keys); r.theirs = append(r.theirs, v); return err },
			}
			if f.held {
				steps = append(steps, func() error { v, err := b.drainOurs(sh.keys, true); h.ours = append(h.ours, v); return err })
			}
			if round%2 == 1 {
				slices.Reverse(steps)
			}
			for _, step := range steps {
				if err := step(); err != nil {
					return d.queryError("bench "+r.name, err)
				}
			}
		}
		runs = append(runs, r)
		if f.held {
			h.theirs = r.ours
			heldRuns = append(heldRuns, h)
		}
		fmt.Fprintf(out, "  %-34s done\n", r.name)
	}
	peak := peakRSS()

	w := &benchRun{name: fmt.Sprintf("write path, %d writers", f.writers), unit: "tx/s"}
	for round := range f.rounds {
		if !slices.Contains(f.only, "write") {
			break
		}
		steps := []func() error{
			func() error { v, err := b.writeOurs(); w.ours = append(w.ours, v); return err },
			func() error { v, err := b.writeRaw(); w.theirs = append(w.theirs, v); return err },
		}
		if round%2 == 1 {
			slices.Reverse(steps)
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return d.queryError("bench write path", err)
			}
		}
	}
	if len(w.ours) > 0 {
		runs = append([]*benchRun{w}, runs...)
		fmt.Fprintf(out, "  %-34s done\n", w.name)
	}

	var lat, held latencyResult
	latency := slices.Contains(f.only, "latency")
	if latency {
		var err error
		if !f.heldOnly {
			if lat, err = b.latency(false); err != nil {
				return d.queryError("bench latency", err)
			}
		}
		if f.held {
			if held, err = b.latency(true); err != nil {
				return d.queryError("bench latency with a held snapshot", err)
			}
		}
	}

	var tb benchTable
	tb.row("measure", "outbox", "raw loop", "ratio")
	for _, r := range runs {
		o, t := median(r.ours), median(r.theirs)
		tb.row(r.name+" ("+r.unit+")", fmt.Sprintf("%.0f", o), fmt.Sprintf("%.0f", t), fmt.Sprintf("%.2f", o/t))
	}
	if len(heldRuns) > 0 {
		tb.row("with a snapshot held open", "outbox", "without", "ratio")
		for _, r := range heldRuns {
			o, t := median(r.ours), median(r.theirs)
			tb.row(r.name+" ("+r.unit+")", fmt.Sprintf("%.0f", o), fmt.Sprintf("%.0f", t), fmt.Sprintf("%.2f", o/t))
		}
	}
	if latency {
		shape := "unordered"
		if f.latKeys > 0 {
			shape = fmt.Sprintf("%d keys", f.latKeys)
		}
		title := fmt.Sprintf("latency at %.0f/s, %s, p50/p99/worst (ms)", f.rate, shape)
		if f.heldOnly {
			// No run without the snapshot to compare with: the held run's figures alone.
			tb.row(title+", held snapshot", held.String())
		} else {
			tb.row(title, lat.String())
		}
		if f.held && !f.heldOnly {
			tb.row("  with a held snapshot (ms)", held.String(), "p99 ratio", fmt.Sprintf("%.2f", held.p99/lat.p99))
		}
	}
	if len(runs) > 0 {
		tb.row("peak RSS after the drains (MiB)", fmt.Sprintf("%.0f", peak))
	}
	_, err := io.WriteString(out, "\n"+tb.String())
	return err
}

// benchTable is bench's result table: the first column left-aligned, the others right-aligned,
// each as wide as its widest cell, so that every row's figures line up under the headers.
type benchTable struct{ rows [][]string }

func (t *benchTable) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *benchTable) String() string {
	var width []int
	for _, r := range t.rows {
		for i, c := range r {
			if i == len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(c + pad)
				continue
			}
			b.WriteString("  " + pad + c)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// seed writes n events (keys = 0: unordered; else over that many keys) with EnqueueMany, 1,000
// per transaction, then settles the table.
func (b *bench) seed(schema outbox.SchemaConfig, n, keys int) error {
	for start := 0; start < n; start += 1000 {
		ins := make([]outbox.EventInput, 0, 1000)
		for i := start; i < min(n, start+1000); i++ {
			in := outbox.EventInput{Topic: "bench", Payload: []byte(`{"n":` + strconv.Itoa(i) + `}`)}
			if keys > 0 {
				in.OrderingKey = "k" + strconv.Itoa(i%keys)
			}
			ins = append(ins, in)
		}
		err := b.d.InTx(b.ctx, func(tx any, _ txExec) error {
			pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
			if err != nil {
				return err
			}
			_, err = pub.EnqueueMany(b.ctx, ins)
			return err
		})
		if err != nil {
			return err
		}
	}
	b.d.Settle(b.ctx, schema.Table)
	return nil
}

// drainOurs drains a fresh backlog with one relay and returns events/s; held keeps a snapshot
// open from before the backlog is written to the end of the drain.
func (b *bench) drainOurs(keys int, held bool) (float64, error) {
	schema, err := b.migrate(b.table())
	if err != nil {
		return 0, err
	}
	if held {
		release, err := b.d.HoldSnapshot(b.ctx, schema.Table)
		if err != nil {
			return 0, fmt.Errorf("holding a snapshot: %w", err)
		}
		defer release()
	}
	if err := b.seed(schema, b.f.events, keys); err != nil {
		return 0, err
	}
	var marked atomic.Int64
	done := make(chan struct{})
	n := int64(b.f.events)
	sub, err := outbox.NewSubscriber(b.d.Handle(), outbox.SubscriberConfig{Schema: schema, BatchSize: 1000, MaxRunPerKey: 100, Concurrency: 100,
		PollInterval: 10 * time.Millisecond, Hooks: outbox.Hooks{OnDelivered: func(outbox.DeliveredInfo) {
			if marked.Add(1) == n {
				close(done)
			}
		}}}, b.logger)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	start := time.Now()
	ch, err := sub.Subscribe(b.ctx, "bench")
	if err != nil {
		return 0, err
	}
	go func() {
		for m := range ch {
			m.Ack()
		}
	}()
	select {
	case <-done:
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	case <-time.After(30 * time.Minute):
		return 0, fmt.Errorf("%d of %d events delivered in 30 minutes", marked.Load(), n)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// drainRaw drains a fresh backlog with the order-blind loop (lease the oldest 1,000 claimable
// rows through its own pending index, mark them published) and returns events/s.
func (b *bench) drainRaw(keys int) (float64, error) {
	schema, err := b.migrate(b.table())
	if err != nil {
		return 0, err
	}
	if err := b.d.RawIndex(b.ctx, schema.Table); err != nil {
		return 0, err
	}
	if err := b.seed(schema, b.f.events, keys); err != nil {
		return 0, err
	}
	start := time.Now()
	total := 0
	for {
		n, err := b.d.RawRound(b.ctx, schema.Table)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		total += n
	}
	if total != b.f.events {
		return 0, fmt.Errorf("raw loop marked %d events, want %d", total, b.f.events)
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// writeLoop runs --tx transactions over --writers writers, each a business INSERT then event
// (which writes what is compared), and returns transactions/s.
func (b *bench) writeLoop(event func(tx any, exec txExec, i int) error) (float64, error) {
	biz := b.table()
	if err := b.d.Exec(b.ctx, `CREATE TABLE `+b.d.Ident(biz)+` (id `+b.d.KeyType()+` PRIMARY KEY, v INTEGER NOT NULL)`); err != nil {
		return 0, err
	}
	insert := `INSERT INTO ` + b.d.Ident(biz) + ` (id, v) VALUES (` + b.d.Params(2) + `)`
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var ferr error
	start := time.Now()
	for range b.f.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > b.f.tx {
					return
				}
				err := b.d.InTx(b.ctx, func(tx any, exec txExec) error {
					if err := exec(insert, watermill.NewUUID(), i); err != nil {
						return err
					}
					return event(tx, exec, i)
				})
				if err != nil {
					once.Do(func() { ferr = err; next.Store(int64(b.f.tx)) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(b.f.tx) / time.Since(start).Seconds(), ferr
}

func (b *bench) writeOurs() (float64, error) {
	schema, err := b.migrate(b.table())
	if err != nil {
		return 0, err
	}
	return b.writeLoop(func(tx any, _ txExec, i int) error {
		pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			return err
		}
		m := outbox.NewMessage([]byte(`{"order":` + strconv.Itoa(i) + `}`))
		outbox.SetOrderingKey(m, "customer-"+strconv.Itoa(i%1000))
		return pub.Publish("orders", m)
	})
}

// writeRaw is the comparator: one row into a plain events table (identity, id, topic, payload,
// creation time; one index), as a hand-written outbox or watermill-sql's would be.
func (b *bench) writeRaw() (float64, error) {
	t := b.table()
	if err := b.d.Exec(b.ctx, `CREATE TABLE `+b.d.Ident(t)+` `+b.d.RawEventsColumns()); err != nil {
		return 0, err
	}
	insert := `INSERT INTO ` + b.d.Ident(t) + ` (id, payload, topic) VALUES (` + b.d.Params(2) + `, 'orders')`
	return b.writeLoop(func(_ any, exec txExec, i int) error {
		return exec(insert, watermill.NewUUID(), `{"order":`+strconv.Itoa(i)+`}`)
	})
}

// latencyResult is a latency run's commit → handler delays, in milliseconds.
type latencyResult struct{ p50, p99, worst float64 }

func (l latencyResult) String() string {
	return fmt.Sprintf("%.1f/%.1f/%.1f", l.p50, l.p99, l.worst)
}

// latency writes --rate keyed events/s (100 keys, one event per transaction) for --duration
// while one relay (on its own pool), woken in-process after each commit, delivers them; held
// keeps a snapshot open from before the first write to the end.
func (b *bench) latency(held bool) (latencyResult, error) {
	schema, err := b.migrate(b.table())
	if err != nil {
		return latencyResult{}, err
	}
	if held {
		release, err := b.d.HoldSnapshot(b.ctx, schema.Table)
		if err != nil {
			return latencyResult{}, fmt.Errorf("holding a snapshot: %w", err)
		}
		defer release()
	}
	w := wakeup.NewInProcess()
	defer w.Close()
	// The relay gets a pool of its own, as in its own process (outbox relay): on the writers'
	// pool (pgxpool's default size is 4) its claims and marks queued for a connection behind
	// --writers transactions.
	relayDB, closeRelayDB, err := b.d.NewHandle(b.ctx)
	if err != nil {
		return latencyResult{}, err
	}
	defer closeRelayDB()
	sub, err := outbox.NewSubscriber(relayDB, outbox.SubscriberConfig{Schema: schema, BatchSize: 1000, PollInterval: 10 * time.Millisecond, Wakeup: w}, b.logger)
	if err != nil {
		return latencyResult{}, err
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	ch, err := sub.Subscribe(ctx, "latency")
	if err != nil {
		return latencyResult{}, err
	}
	total := int(b.f.rate * b.f.duration.Seconds())
	type sample struct {
		at  time.Time
		lag time.Duration
	}
	samples := make([]sample, 0, total)
	committed := sync.Map{} // event id → commit time
	got := make(chan error, 1)
	go func() {
		for len(samples) < total {
			select {
			case m, ok := <-ch:
				if !ok {
					got <- errors.New("subscription closed")
					return
				}
				now := time.Now()
				if at, ok := committed.Load(m.UUID); ok {
					samples = append(samples, sample{now, now.Sub(at.(time.Time))})
				}
				m.Ack()
			case <-ctx.Done():
				got <- ctx.Err()
				return
			}
		}
		got <- nil
	}()
	first := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var werr error
	var once sync.Once
	for range b.f.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				time.Sleep(time.Until(first.Add(time.Duration(float64(i) / b.f.rate * float64(time.Second)))))
				coll := wakeup.NewCollector(w)
				m := outbox.NewMessage([]byte(`{"n":` + strconv.FormatInt(i, 10) + `}`))
				if b.f.latKeys > 0 {
					outbox.SetOrderingKey(m, "k"+strconv.FormatInt(i%int64(b.f.latKeys), 10))
				}
				err := b.d.InTx(ctx, func(tx any, _ txExec) error {
					pub, err := outbox.NewPublisher(tx, coll.PublisherConfig(outbox.PublisherConfig{Schema: schema}), nil)
					if err != nil {
						return err
					}
					committed.Store(m.UUID, time.Now()) // just before COMMIT: the delay includes the commit
					return pub.Publish("latency", m)
				})
				if err != nil {
					coll.Discard()
					once.Do(func() { werr = err; cancel() })
					return
				}
				coll.Committed()
			}
		}()
	}
	wg.Wait()
	if werr != nil {
		return latencyResult{}, werr
	}
	select {
	case err := <-got:
		if err != nil {
			return latencyResult{}, err
		}
	case <-time.After(b.f.duration + 5*time.Minute):
		cancel()
		return latencyResult{}, fmt.Errorf("%d of %d events delivered", len(samples), total)
	}
	pct := func(ss []sample, q float64) float64 {
		lags := make([]float64, len(ss))
		for i, s := range ss {
			lags[i] = float64(s.lag) / float64(time.Millisecond)
		}
		slices.Sort(lags)
		return lags[int(q*float64(len(lags)-1))]
	}
	res := latencyResult{p50: pct(samples, 0.5), p99: pct(samples, 0.99)}
	if b.f.windows {
		fmt.Fprintf(b.out, "  latency windows%s (s from start: events, p50/p99/max ms)\n", map[bool]string{true: ", held snapshot"}[held])
	}
	for from := first; from.Before(first.Add(b.f.duration)); from = from.Add(10 * time.Second) {
		var win []sample
		for _, s := range samples {
			if !s.at.Before(from) && s.at.Before(from.Add(10*time.Second)) {
				win = append(win, s)
			}
		}
		if len(win) > 0 {
			res.worst = max(res.worst, pct(win, 0.99))
			if b.f.windows {
				fmt.Fprintf(b.out, "  %5.0f: %6d  %.1f/%.1f/%.1f\n", from.Sub(first).Seconds(), len(win), pct(win, 0.5), pct(win, 0.99), pct(win, 1))
			}
		}
	}
	return res, nil
}

// peakRSS is the process's peak resident set size in MiB (VmHWM of /proc/self/status; 0 where
// that file does not exist).
func peakRSS() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
