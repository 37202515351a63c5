package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
	"github.com/watermill-outbox/outbox/internal/dialect/sqlite/sqliteurl"
	"github.com/watermill-outbox/outbox/wakeup"
)

// demoFlags are the demo's settings.
type demoFlags struct {
	db, dbFile, to string
	writers        int
	transactions   int
	keys           int
	rollbackRate   float64
	rate           float64
	drainTx        int
	drainSet       bool // --drain-transactions was given
	failRate       float64
	deadline       time.Duration
	quiet, keep    bool
	secret         string
	allow          []string
}

// defaultDemoRate is the demo's default --rate in transactions per second (about 500 events/s):
// well below what the relay delivers on any of the databases, so the latency shown is the one
// of a relay that keeps up.
const defaultDemoRate = 250

// demoEvents are the topics a demo order goes through; a transaction writes the first 1–3.
var demoEvents = []string{"demo.order.placed", "demo.order.paid", "demo.order.shipped"}

// errRollback makes a demo transaction roll back on purpose.
var errRollback = errors.New("rolled back on purpose")

func newDemoCmd() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo [--db URL | --db-file PATH] [--to URL]",
		Short: "Run the outbox end to end with no set-up and check its guarantees",
		Long: `demo shows the outbox at work and checks its guarantees, with no server to set up.

Writers commit transactions that each insert an order row and publish 1–3 events through the
outbox in the same transaction, with the customer as ordering key; some transactions roll back
on purpose after publishing. Meanwhile a relay delivers the events to a sink. By default the
database is an SQLite file in a temporary directory and the sink is an HTTP receiver on
127.0.0.1 that verifies every request's HMAC signature and refuses some requests on purpose
(--fail-rate), so the relay retries them.

The writers are paced at --rate transactions per second (about two events each), well below
what the relay delivers, so the latency from COMMIT to receipt is the one an application sees
while the relay keeps up; --rate 0 runs them as fast as the database takes them (the latency
then includes the relay's backlog). Then the relay's throughput is measured on its own: with
the relay stopped, --drain-transactions more transactions are written (over keys of their
own), and the relay is started again and times how long it takes to deliver that backlog
(with --to, only when --drain-transactions is given).

The report says how many events were committed, rolled back and delivered, the duplicates,
the per-key order violations, the latency from COMMIT to receipt, and the relay's throughput
on the backlog. Its last line is

  delivered=N committed=N duplicates=D reordered=0 rolled_back_delivered=0

and the exit status is non-zero when a committed event was not delivered within --deadline,
an event of a rolled-back transaction was delivered, or a key's events arrived out of order.
Duplicates are allowed (delivery is at least once) and reported.

--to sends the events elsewhere and reads them back with the broker's stock Watermill
subscriber: kafka://host:9092, amqp://user:password@host:5672/, redis://host:6379. With
http(s)://… the demo counts the events the webhook answered with 2xx, in the order the relay
delivered them.

--db takes a PostgreSQL URL (postgres://…), a MariaDB/MySQL URL (mysql://…) or an SQLite file;
the demo creates its own tables (named outbox_demo_<id> and demo_orders_<id> unless the
database is the temporary file; on MariaDB/MySQL also the key-lock table outbox_demo_<id>_keys)
and drops them at the end unless --keep is given.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			f.drainSet = cmd.Flags().Changed("drain-transactions")
			err := runDemo(ctx, f, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil && ctx.Err() != nil && cmd.Context().Err() == nil {
				if f.keep {
					return &failedError{"demo interrupted; its tables were kept (--keep)"}
				}
				return &failedError{"demo interrupted; its tables and temporary files were removed"}
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.db, "db", "", "database URL (postgres://…, mysql://… or sqlite://PATH); default: an SQLite file in a temporary directory")
	fl.StringVar(&f.dbFile, "db-file", "", "SQLite file to use instead of a temporary one (created when missing)")
	fl.StringVar(&f.to, "to", "", "sink: kafka://host:9092, amqp://user:password@host:5672/, redis://host:6379 or http(s)://…; default: a signature-checking HTTP receiver on 127.0.0.1")
	fl.IntVar(&f.writers, "writers", 4, "concurrent writers")
	fl.IntVar(&f.transactions, "transactions", 2000, "transactions in all, spread over the writers")
	fl.IntVar(&f.keys, "keys", 50, "customers (ordering keys), spread over the writers")
	fl.Float64Var(&f.rate, "rate", defaultDemoRate, "transactions per second, all writers together (about 2 events each); 0 = as fast as the database takes them (latency then includes the relay's backlog)")
	fl.IntVar(&f.drainTx, "drain-transactions", 1000, "transactions written with the relay stopped after the paced run, to time the relay on a backlog (at most --transactions); 0 = no drain phase; with --to only when given")
	fl.Float64Var(&f.rollbackRate, "rollback-rate", 0.1, "fraction of transactions rolled back on purpose after publishing, 0..1")
	fl.Float64Var(&f.failRate, "fail-rate", 0.02, "fraction of requests the built-in receiver refuses with 500 on purpose (they are retried with backoff), 0..0.5")
	fl.DurationVar(&f.deadline, "deadline", 30*time.Second, "how long to wait for delivery after the last commit, a Go duration")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar (it is also off when stderr is not a terminal)")
	fl.BoolVar(&f.keep, "keep", false, "keep the tables (and the temporary SQLite file) after the demo, and print where")
	fl.StringVar(&f.secret, "secret", "", "webhook signing secret for --to http(s)://…; empty = a random one (the built-in receiver always uses a random one)")
	fl.StringSliceVar(&f.allow, "allow-prefix", nil, "for --to http(s)://…: private or loopback range the relay may reach (CIDR, e.g. 127.0.0.0/8)")
	return cmd
}

func (f demoFlags) validate() error {
	switch {
	case f.writers < 1 || f.writers > 64:
		return &usageError{fmt.Errorf("--writers %d: give 1..64", f.writers)}
	case f.transactions < 1:
		return &usageError{fmt.Errorf("--transactions %d: give at least 1", f.transactions)}
	case f.keys < f.writers:
		return &usageError{fmt.Errorf("--keys %d: give at least --writers (%d), each writer owns its keys", f.keys, f.writers)}
	case f.rollbackRate < 0 || f.rollbackRate > 1:
		return &usageError{fmt.Errorf("--rollback-rate %g: give 0..1", f.rollbackRate)}
	case f.failRate < 0 || f.failRate > 0.5:
		return &usageError{fmt.Errorf("--fail-rate %g: give 0..0.5", f.failRate)}
	case f.drainTx < 0:
		return &usageError{fmt.Errorf("--drain-transactions %d: give 0 (no drain phase) or more", f.drainTx)}
	case f.rate < 0:
		return &usageError{fmt.Errorf("--rate %g: give 0 (unlimited) or more", f.rate)}
	case f.deadline <= 0:
		return &usageError{fmt.Errorf("--deadline %s: give a positive duration", f.deadline)}
	case f.db != "" && f.dbFile != "":
		return &usageError{fmt.Errorf("give --db or --db-file, not both")}
	}
	return nil
}

// randomHex returns n random bytes as hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

func runDemo(ctx context.Context, f demoFlags, stdout, stderr io.Writer) (err error) {
	if err := f.validate(); err != nil {
		return err
	}
	var dest destURL
	if f.to != "" {
		if dest, err = parseDestURL(f.to); err != nil {
			return err
		}
	}
	// The database.
	runID := randomHex(4)
	var (
		u       dburl.URL
		tempDir string
	)
	switch {
	case f.db != "":
		if u, err = parseDBURL(f.db); err != nil {
			return err
		}
	case f.dbFile != "":
		u = sqliteurl.File(f.dbFile)
	default:
		if tempDir, err = os.MkdirTemp("", "outbox-demo-"); err != nil {
			return fmt.Errorf("creating a temporary directory: %v (set TMPDIR or use --db-file)", err)
		}
		path := filepath.Join(tempDir, "demo.db")
		u = sqliteurl.File(path)
		defer func() {
			if !f.keep {
				_ = os.RemoveAll(tempDir)
			}
		}()
	}
	table, business := "outbox_demo_"+runID, "demo_orders_"+runID
	if tempDir != "" {
		table, business = outbox.DefaultTable, "demo_orders"
	}
	d, err := openDB(ctx, u, table, openOptions{create: true})
	if err != nil {
		return err
	}
	defer d.Close()
	if err := outbox.Migrate(ctx, d.Handle(), d.schema); err != nil {
		return d.queryError("creating the outbox table", err)
	}
	if err := d.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id %s PRIMARY KEY, customer %[2]s NOT NULL, seq INTEGER NOT NULL, amount_cents INTEGER NOT NULL)`, d.Ident(business), d.KeyType())); err != nil {
		return d.queryError("creating the demo table", err)
	}
	defer func() {
		if f.keep || tempDir != "" {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = d.dropTables(cctx, append([]string{business}, d.OutboxTables(table)...)...)
	}()

	tr := newTracker()
	logger := watermill.NopLogger{}

	// The sink, then the relay into it.
	destTopic := "outbox-demo-" + runID
	var s *demoSink
	if f.to == "" {
		s, err = startReceiver(tr, f.failRate)
	} else {
		s, err = startBrokerSink(ctx, dest, destTopic, f, tr, logger)
	}
	if err != nil {
		return err
	}
	defer s.close()

	w := wakeup.NewInProcess()
	defer w.Close()
	var fcfg forwarder.Config
	if s.fixedTopic != "" {
		fcfg.Topic = func(string, *message.Message) string { return s.fixedTopic }
	}
	rel, err := startDemoRelay(ctx, d, w, s, fcfg, tr, logger)
	if err != nil {
		return err
	}
	defer func() { rel.stop() }()

	pace := "unpaced (--rate 0)"
	if f.rate > 0 {
		pace = fmt.Sprintf("at %g/s (--rate)", f.rate)
	}
	fmt.Fprintf(stdout, "outbox demo: %s, %s %s over %s, %s → %s\n", plural(int64(f.writers), "writer", "writers"),
		plural(int64(f.transactions), "transaction", "transactions"), pace, plural(int64(f.keys), "key", "keys"), d.where(), s.name)
	bar := startProgress(stderr, f.quiet, tr)

	// The writers, paced, with the relay running: the latency.
	tr.writing.Store(true)
	werr := writeDemo(ctx, d, business, w, f, tr, demoPhase{keyPrefix: "customer-"})
	tr.writing.Store(false)
	var waitErr error
	if werr == nil {
		waitErr = waitDelivered(ctx, rel, tr, f.deadline)
	}
	paced := tr.report()
	// The drain: a backlog written with the relay stopped, then delivered by a new relay: the
	// relay's throughput.
	var drain *demoDrain
	n := min(f.drainTx, f.transactions)
	if f.to != "" && !f.drainSet {
		n = 0 // the drain phase runs with the built-in receiver, or when asked for
	}
	if n > 0 && werr == nil && waitErr == nil {
		rel.stop()
		df := f
		df.rate, df.transactions = 0, n
		tr.writing.Store(true)
		werr = writeDemo(ctx, d, business, w, df, tr, demoPhase{keyPrefix: "backlog-customer-", firstOrder: f.transactions})
		tr.writing.Store(false)
		if werr == nil {
			before := tr.nReceived.Load()
			started := time.Now()
			if rel, err = startDemoRelay(ctx, d, w, s, fcfg, tr, logger); err != nil {
				return err
			}
			if waitErr = waitDelivered(ctx, rel, tr, f.deadline); waitErr == nil {
				drain = &demoDrain{transactions: n, events: tr.nReceived.Load() - before, took: tr.lastReceipt().Sub(started)}
			}
		}
	}
	bar.stop()
	rel.stop()
	s.close()
	if werr != nil {
		return werr
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if waitErr != nil && !errors.Is(waitErr, context.DeadlineExceeded) {
		return waitErr
	}

	r := tr.report()
	// Latency and the write rate are the paced run's; the counts and checks cover both phases.
	r.P50, r.P99, r.Max, r.Throughput, r.Elapsed, r.WriteRate, r.TxRate, r.Drain = paced.P50, paced.P99, paced.Max, paced.Throughput, paced.Elapsed, paced.WriteRate, paced.TxRate, paced.Drain
	var extra []string
	if s.receiver {
		extra = append(extra, signaturesLine(tr.verified.Load(), tr.rejected.Load(), tr.refused.Load()))
	}
	extra = append(extra, fmt.Sprintf("relay               %s marked published", plural(tr.marked.Load(), "event", "events")))
	var after []string
	if f.rate > 0 {
		after = append(after, rateLine(f.rate, r.TxRate))
	}
	if note := backlogNote(f.rate, r); note != "" {
		after = append(after, note)
	}
	if drain != nil {
		after = append(after, drain.line())
	}
	if f.keep {
		after = append(after, keptLines(d, u, tempDir, table, business)...)
	}
	r.print(stdout, extra, after)
	if msg := r.failure(f.deadline); msg != "" {
		return &failedError{msg}
	}
	return nil
}

// demoRelay is one run of the demo's relay: a Subscriber and a forwarder into the sink.
type demoRelay struct {
	sub     *outbox.Subscriber
	fwd     *forwarder.Forwarder
	cancel  context.CancelFunc
	done    chan struct{}
	err     error // the forwarder's Run result, set before done is closed
	stopped bool
}

// startDemoRelay starts a relay of d's outbox table into the sink s.
func startDemoRelay(ctx context.Context, d *database, w *wakeup.InProcess, s *demoSink, fcfg forwarder.Config, tr *tracker, logger watermill.LoggerAdapter) (*demoRelay, error) {
	sub, err := outbox.NewSubscriber(d.Handle(), outbox.SubscriberConfig{
		Schema:       d.schema,
		PollInterval: 200 * time.Millisecond,
		BatchSize:    500,
		MaxAttempts:  10,
		RetryBase:    50 * time.Millisecond,
		RetryMax:     time.Second,
		Concurrency:  32,
		Wakeup:       w,
		Hooks:        outbox.Hooks{OnDelivered: func(outbox.DeliveredInfo) { tr.marked.Add(1) }},
	}, logger)
	if err != nil {
		return nil, err
	}
	fwd, err := forwarder.New(sub, s.pub, fcfg, logger)
	if err != nil {
		_ = sub.Close()
		return nil, err
	}
	r := &demoRelay{sub: sub, fwd: fwd, done: make(chan struct{})}
	var rctx context.Context
	rctx, r.cancel = context.WithCancel(ctx)
	go func() { r.err = fwd.Run(rctx); close(r.done) }()
	return r, nil
}

// stop stops the relay and waits for it; idempotent.
func (r *demoRelay) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	r.cancel()
	_ = r.fwd.Close()
	<-r.done
}

// demoPhase tells the writers their customers (keyPrefix and a number) and the number of
// their first order: the drain phase writes over keys and orders of its own.
type demoPhase struct {
	keyPrefix  string
	firstOrder int
}

// demoDrain is the drain phase's outcome: the backlog and how long a new relay took to
// deliver it, from its start to the last receipt.
type demoDrain struct {
	transactions int
	events       int64
	took         time.Duration
}

// line is the report's line on the drain phase.
func (d demoDrain) line() string {
	return fmt.Sprintf("relay throughput    %.0f events/s: a backlog of %s (%s written with the relay stopped) delivered in %s",
		float64(d.events)/max(d.took.Seconds(), 1e-3), plural(d.events, "event", "events"), plural(int64(d.transactions), "transaction", "transactions"), d.took.Round(time.Millisecond))
}

// signaturesLine is the report's line on the built-in receiver's checks.
func signaturesLine(verified, rejected, refused int64) string {
	return fmt.Sprintf("signatures          %d verified, %d rejected; %s on purpose (500) and retried",
		verified, rejected, plural(refused, "request refused", "requests refused"))
}

// rateLine is the report's line on --rate: the transactions per second the writers reached
// beside the rate asked, in the flag's unit, and when they fell short by more than a tenth,
// that they could not go faster (a writer starts its next transaction only after its last one
// ended, and the pacing makes up late starts, so falling short means the writers were always
// busy).
func rateLine(asked, achieved float64) string {
	prec := 0
	if achieved < 100 {
		prec = 1
	}
	line := fmt.Sprintf("rate                %.*f transactions/s reached, %g asked (--rate)", prec, achieved, asked)
	if achieved < 0.9*asked {
		line += ": the writers could not go faster on this database"
	}
	return line
}

// backlogLatency and backlogDrain are where the demo says that the relay ran behind the
// writers: a p50 latency above backlogLatency, or the last event delivered more than
// backlogDrain after the last commit.
const (
	backlogLatency = 100 * time.Millisecond
	backlogDrain   = time.Second
)

// backlogNote is the report's note when the relay had a backlog during an unpaced run (its
// latency then measures the backlog, not the relay), "" otherwise.
func backlogNote(rate float64, r demoReport) string {
	if rate != 0 || (r.P50 <= backlogLatency && r.Drain <= backlogDrain) {
		return ""
	}
	return fmt.Sprintf("note                the relay ran behind the writers (p50 %s; last delivery %s after the last commit), so latency includes its backlog: try --rate",
		r.P50.Round(time.Millisecond), r.Drain.Round(time.Millisecond))
}

// keptLines are the report's closing lines under --keep: what was kept, where, how to look at
// it and how to drop it.
func keptLines(d *database, u dburl.URL, tempDir, table, business string) []string {
	if tempDir != "" {
		return []string{
			fmt.Sprintf("kept                SQLite file %s (outbox table %s, demo table %s)", u.File(), table, business),
			fmt.Sprintf("inspect             outbox status --db %s", shellQuote(u.File())),
			fmt.Sprintf("drop                rm -r %s", shellQuote(tempDir)),
		}
	}
	return []string{
		fmt.Sprintf("kept                tables %s and %s in %s", table, business, d.where()),
		fmt.Sprintf("inspect             outbox status --db %s --table %s", shellQuote(u.Shown()), table),
		"drop                " + u.DropCommand(append([]string{business}, d.OutboxTables(table)...)),
	}
}

// writeDemo runs the writers and returns the first error other than a purposeful rollback.
func writeDemo(ctx context.Context, d *database, business string, w *wakeup.InProcess, f demoFlags, tr *tracker, ph demoPhase) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		once sync.Once
		ferr error
	)
	// pace waits for the next transaction's start at --rate per second, all writers together
	// (nil = unlimited): the n-th start is due n/rate after the first, so a start that a busy
	// writer takes late is made up by the next ones instead of being lost (as a ticker's
	// dropped ticks would be). It returns false when ctx ends.
	first := time.Now()
	tr.start(first)
	var pace func() bool
	if f.rate > 0 {
		var starts atomic.Int64
		every := float64(time.Second) / f.rate
		pace = func() bool {
			due := first.Add(time.Duration(float64(starts.Add(1)-1) * every))
			wait := time.NewTimer(time.Until(due))
			defer wait.Stop()
			select {
			case <-wait.C:
				return true
			case <-ctx.Done():
				return false
			}
		}
	}
	insert := fmt.Sprintf(`INSERT INTO %s (id, customer, seq, amount_cents) VALUES (%s)`, d.Ident(business), d.Params(4))
	for wr := range f.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var own []string
			for k := wr; k < f.keys; k += f.writers {
				own = append(own, fmt.Sprintf("%s%03d", ph.keyPrefix, k))
			}
			seq := map[string]int{}
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(wr)))
			for n := wr; n < f.transactions && ctx.Err() == nil; n += f.writers {
				if pace != nil && !pace() {
					return
				}
				cust := own[rng.IntN(len(own))]
				events := 1 + rng.IntN(len(demoEvents))
				rollback := rng.Float64() < f.rollbackRate
				order := fmt.Sprintf("order-%06d", ph.firstOrder+n)
				amount := 100 + rng.IntN(100000)
				var (
					ids  []string
					evs  []demoPayload
					coll = wakeup.NewCollector(w)
				)
				start := time.Now()
				tr.wrote(start)
				err := d.InTx(ctx, func(tx any, exec txExec) error {
					if err := exec(insert, order, cust, seq[cust]+events, amount); err != nil {
						return err
					}
					pub, err := outbox.NewPublisher(tx, coll.PublisherConfig(outbox.PublisherConfig{Schema: d.schema}), nil)
					if err != nil {
						return err
					}
					for i := range events {
						p := demoPayload{Order: order, Customer: cust, Seq: seq[cust] + i + 1, Event: demoEvents[i], AmountCents: amount}
						body, _ := json.Marshal(p)
						msg := outbox.NewMessage(body)
						outbox.SetOrderingKey(msg, cust)
						msg.Metadata.Set("source", "outbox demo")
						if err := pub.Publish(demoEvents[i], msg); err != nil {
							return err
						}
						ids, evs = append(ids, msg.UUID), append(evs, p)
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				switch {
				case err == nil:
					coll.Committed()
					seq[cust] += events
					tr.commit(ids, evs, time.Now())
				case errors.Is(err, errRollback):
					coll.Discard()
					tr.rollback(ids, time.Now())
				default:
					coll.Discard()
					once.Do(func() {
						ferr = d.queryError(fmt.Sprintf("writer %d: transaction for %s", wr, order), err)
						cancel()
					})
					return
				}
			}
		}()
	}
	wg.Wait()
	return ferr
}

// waitDelivered waits until every committed event has arrived and nothing is pending, or
// deadline passes (context.DeadlineExceeded).
// A relay that stops by itself (it could not subscribe) ends the wait with its error.
func waitDelivered(ctx context.Context, rel *demoRelay, tr *tracker, deadline time.Duration) error {
	sub := rel.sub
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if tr.missing() == 0 {
			b, err := sub.Backlog(ctx)
			if err == nil && b.Pending == 0 {
				return nil
			}
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("reading the backlog: %s", oneLine(err.Error()))
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-rel.done:
			return fmt.Errorf("the relay stopped: %v", rel.err)
		case <-tick.C:
		}
	}
}

// progress is the demo's progress bar (delivered of committed) on stderr.
type progress struct {
	done chan struct{}
	wg   sync.WaitGroup
	bar  *progressbar.ProgressBar
}

// startProgress starts the bar unless quiet or stderr is not a terminal.
func startProgress(stderr io.Writer, quiet bool, tr *tracker) *progress {
	p := &progress{done: make(chan struct{})}
	f, isFile := stderr.(*os.File)
	if quiet || !isFile || !term.IsTerminal(int(f.Fd())) {
		return p
	}
	p.bar = progressbar.NewOptions64(1,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetDescription("delivered/committed"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("events"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionClearOnFinish(),
	)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			// While writers run, the bar's end stays one past what is committed: a bar that
			// reaches its end finishes and stops updating.
			m := tr.nCommitted.Load()
			if tr.writing.Load() {
				m++
			}
			p.bar.ChangeMax64(max(1, m))
			_ = p.bar.Set64(tr.nReceived.Load())
			select {
			case <-p.done:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// stop ends the bar and clears its line.
func (p *progress) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	p.wg.Wait()
	if p.bar != nil {
		_ = p.bar.Clear()
		_ = p.bar.Exit()
	}
}
