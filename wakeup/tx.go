package wakeup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
)

// Collector gathers the topics one transaction inserted (through the OnInserted hook of the
// publisher config it returns) and signals them once, after COMMIT: one signal per topic per
// transaction, none after a rollback. It is the building block of RunInTx for code that manages
// its own transactions:
//
//	c := wakeup.NewCollector(w)
//	pub, _ := outbox.NewPublisher(tx, c.PublisherConfig(cfg), nil)
//	… publish …
//	if err := tx.Commit(ctx); err != nil {
//		c.Discard()
//		return err
//	}
//	c.Committed()
//
// Events the caller rolls back to a savepoint of its own inside a transaction that then
// commits are still signalled: harmless, one poll finds nothing. A Collector belongs to one
// transaction at a time; it is safe for concurrent use (a publisher over a transaction is not).
type Collector struct {
	w      Wakeup
	mu     sync.Mutex
	topics []string
}

// NewCollector returns a Collector signalling through w.
func NewCollector(w Wakeup) *Collector { return &Collector{w: w} }

// PublisherConfig returns cfg with OnInserted collecting into c (cfg's own OnInserted, if any,
// is still called first), after w's PublisherConfigurer, if it implements one, has set its
// fields (pgnotify's in-transaction mode sets NotifyChannel).
func (c *Collector) PublisherConfig(cfg outbox.PublisherConfig) outbox.PublisherConfig {
	if pc, ok := c.w.(PublisherConfigurer); ok {
		cfg = pc.PublisherConfig(cfg)
	}
	user := cfg.OnInserted
	cfg.OnInserted = func(topics []string) {
		if user != nil {
			user(topics)
		}
		c.Add(topics...)
	}
	return cfg
}

// Add records topics as written by the current transaction.
func (c *Collector) Add(topics ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range topics {
		if !slices.Contains(c.topics, t) {
			c.topics = append(c.topics, t)
		}
	}
}

// Topics returns the distinct topics recorded since the last Committed or Discard.
func (c *Collector) Topics() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.topics)
}

// Committed signals the recorded topics once (w.Signal, which never blocks) and forgets them.
// Call it after a successful COMMIT.
func (c *Collector) Committed() {
	c.mu.Lock()
	topics := c.topics
	c.topics = nil
	c.mu.Unlock()
	if len(topics) > 0 {
		c.w.Signal(topics...)
	}
}

// Discard forgets the recorded topics without signalling. Call it after a rollback or a
// failed COMMIT.
func (c *Collector) Discard() {
	c.mu.Lock()
	c.topics = nil
	c.mu.Unlock()
}

// PgxBeginner starts a pgx transaction: *pgxpool.Pool and *pgx.Conn satisfy it (and pgx.Tx,
// which then runs a savepoint: its "commit" is not a COMMIT, so signals would go out before the
// outer transaction commits — pass the pool or connection instead).
type PgxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// RunInTx begins a transaction on db, builds a Publisher over it whose config is cfg as a
// Collector prepares it (PublisherConfig), runs fn, and commits; after a successful COMMIT it
// signals each topic fn inserted once through w. When fn returns an error or panics, or COMMIT
// fails, the transaction is rolled back and nothing is signalled. It returns fn's error (with
// the rollback's error joined, if any), or the begin/commit error wrapped with context, or a
// *outbox.ConfigError from NewPublisher. Signalling never fails the call: the transaction is
// committed by then. Safe for concurrent use (each call its own transaction).
func RunInTx(ctx context.Context, db PgxBeginner, w Wakeup, cfg outbox.PublisherConfig, fn func(tx pgx.Tx, pub *outbox.Publisher) error) error {
	return runInTx(ctx, w, cfg, func() (txHandle, error) {
		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return pgxTx{tx}, nil
	}, func(h txHandle, pub *outbox.Publisher) error { return fn(h.(pgxTx).Tx, pub) })
}

// RunInSQLTx is RunInTx for database/sql (a *sql.DB of the pgx stdlib driver, or any driver
// the outbox Publisher supports); opts may be nil.
func RunInSQLTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, w Wakeup, cfg outbox.PublisherConfig, fn func(tx *sql.Tx, pub *outbox.Publisher) error) error {
	return runInTx(ctx, w, cfg, func() (txHandle, error) {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		return sqlTx{tx}, nil
	}, func(h txHandle, pub *outbox.Publisher) error { return fn(h.(sqlTx).Tx, pub) })
}

type txHandle interface {
	handle() any
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

type pgxTx struct{ pgx.Tx }

func (t pgxTx) handle() any                        { return t.Tx }
func (t pgxTx) commit(ctx context.Context) error   { return t.Commit(ctx) }
func (t pgxTx) rollback(ctx context.Context) error { return t.Rollback(ctx) }

type sqlTx struct{ *sql.Tx }

func (t sqlTx) handle() any                    { return t.Tx }
func (t sqlTx) commit(context.Context) error   { return t.Commit() }
func (t sqlTx) rollback(context.Context) error { return t.Rollback() }

func runInTx(ctx context.Context, w Wakeup, cfg outbox.PublisherConfig,
	begin func() (txHandle, error), fn func(txHandle, *outbox.Publisher) error) (err error) {
	c := NewCollector(w)
	tx, err := begin()
	if err != nil {
		return fmt.Errorf("wakeup: begin: %w", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		c.Discard()
		rbErr := tx.rollback(context.WithoutCancel(ctx))
		if rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) && !errors.Is(rbErr, sql.ErrTxDone) {
			err = errors.Join(err, fmt.Errorf("wakeup: rollback: %w", rbErr))
		}
	}()
	pub, err := outbox.NewPublisher(tx.handle(), c.PublisherConfig(cfg), nil)
	if err != nil {
		return err
	}
	if err := fn(tx, pub); err != nil {
		return err
	}
	if err := tx.commit(ctx); err != nil {
		return fmt.Errorf("wakeup: commit: %w", err)
	}
	committed = true
	c.Committed()
	return nil
}
