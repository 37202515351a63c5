// Package pgnotify is the PostgreSQL LISTEN/NOTIFY wakeup: relays LISTEN on a channel and
// poll as soon as a notification names a topic they serve.
//
// The writer side has two modes (Config.Mode):
//
//   - AfterCommit (the default): RunInTx (or a Collector) hands each committed transaction's
//     topics to one shared notifier per Wakeup, which sends at most one batch per Window
//     (default 5ms) — one pg_notify per distinct topic, in one short statement — on its own
//     dedicated connection. Writers never NOTIFY themselves, so they never queue on
//     PostgreSQL's cluster-wide notify-queue lock, which a notifying transaction holds
//     through its commit's WAL flush. The notifier's statement commits with
//     synchronous_commit=off, set for that transaction only (a notification is not data:
//     nothing is lost that a poll does not recover), so its own commits do not hold that lock
//     through a flush either. A notification can be lost
//     (notifier connection down, process exit within the window): relays then find the
//     events at their next poll.
//   - InTransaction: pg_notify runs inside the writing transaction, folded into the outbox
//     INSERT (outbox.PublisherConfig.NotifyChannel, set by PublisherConfig): PostgreSQL
//     delivers it exactly at COMMIT and drops it on ROLLBACK, but every notifying COMMIT
//     serialises on the notify-queue lock through its WAL flush, which cuts concurrent write
//     throughput (measured 0.45–0.75× of no wakeup with 8 durable writers, against
//     0.93–1.0× for AfterCommit: BenchmarkWriteThroughput).
//
// The payload is the topic, or "" (wake every relay) when the topic is longer than
// outbox.MaxNotifyTopicBytes: always far below PostgreSQL's 8000-byte limit.
//
// Listeners LISTEN on one dedicated connection per Wakeup that never opens a transaction; it
// must be a direct connection to PostgreSQL (or a session-mode pooler): a transaction-mode
// pooler such as PgBouncer in transaction mode hands the session to other clients between
// statements and the notifications never arrive. When the application's pool goes through
// such a pooler, give New a separate, direct DSN (pgx.ParseConfig of
// "postgres://…@db-host:5432/db"); the pool, the publishers and the relay keep the pooler's.
// New checks this with a self-probe: it LISTENs on a fresh listener connection, sends a
// NOTIFY from another connection and waits up to Config.ProbeTimeout for it; when nothing
// arrives it fails with ErrProbeFailed, whose message names the fix, instead of leaving relays
// that are never woken. A server that cannot LISTEN or NOTIFY (a hot standby, a
// PostgreSQL-compatible database without them) is refused by New.
package pgnotify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
)

// Mode selects the writer side of the wakeup.
type Mode int

const (
	// AfterCommit (the zero value, default) sends coalesced notifications after COMMIT from
	// one shared notifier connection.
	AfterCommit Mode = iota
	// InTransaction folds pg_notify into the writing transaction's INSERT.
	InTransaction
)

// String returns the mode's name ("AfterCommit", "InTransaction").
func (m Mode) String() string {
	switch m {
	case AfterCommit:
		return "AfterCommit"
	case InTransaction:
		return "InTransaction"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults of Config.
const (
	// DefaultChannel is Config.Channel's default.
	DefaultChannel = "watermill_outbox"
	// DefaultListenerApplicationName is Config.ListenerApplicationName's default.
	DefaultListenerApplicationName = "watermill-outbox-wakeup-listener"
	// DefaultNotifierApplicationName is Config.NotifierApplicationName's default.
	DefaultNotifierApplicationName = "watermill-outbox-wakeup-notifier"
	// DefaultPingInterval is Config.PingInterval's default.
	DefaultPingInterval = 30 * time.Second
	// DefaultProbeTimeout is Config.ProbeTimeout's default.
	DefaultProbeTimeout = 5 * time.Second
)

// ErrNotifyUnsupported is matched (errors.Is) by the error of New when the server refuses
// pg_notify (wrapped in an *outbox.ConfigError, with the server's error).
var ErrNotifyUnsupported = errors.New("pgnotify: the server does not support NOTIFY")

// ErrListenUnsupported is matched (errors.Is) by the error of New when the server refuses
// LISTEN (with the server's error), and by the listener's logged error when a server it
// reconnects to refuses it.
var ErrListenUnsupported = errors.New("pgnotify: the server does not support LISTEN")

// ErrProbeFailed is matched (errors.Is) by the error of New (an *outbox.ConfigError) when its
// self-probe's NOTIFY did not reach its LISTEN connection within Config.ProbeTimeout: the
// listener's connection does not keep its session, as behind a transaction-mode pooler
// (PgBouncer pool_mode=transaction). The fix is a direct DSN to PostgreSQL (or a session-mode
// pooler) for New's connConfig.
var ErrProbeFailed = errors.New("pgnotify: self-probe: NOTIFY did not reach the LISTEN connection")

// Config configures a Wakeup. The zero value is valid: channel "watermill_outbox",
// after-commit notifications coalesced per 5ms.
type Config struct {
	// Channel is the LISTEN/NOTIFY channel, at most 63 bytes without NUL. Writers and relays of
	// one outbox table must use the same channel; different tables should use different
	// channels. Default DefaultChannel.
	Channel string
	// Mode is the writer side's mode. Default AfterCommit.
	Mode Mode
	// Window is the after-commit notifier's coalescing window: at most one batch of
	// notifications per window (the first of a quiet period at once). Default
	// wakeup.DefaultWindow (5ms); negative is a configuration error. Unused InTransaction.
	Window time.Duration
	// ListenerApplicationName is the application_name of the listener's connection (it shows
	// in pg_stat_activity). Default DefaultListenerApplicationName.
	ListenerApplicationName string
	// NotifierApplicationName is the application_name of the after-commit notifier's
	// connection. Default DefaultNotifierApplicationName.
	NotifierApplicationName string
	// PingInterval is how long the listener waits for a notification before checking its
	// connection with an empty query (a silently dead connection is found then). Default 30s;
	// negative is a configuration error.
	PingInterval time.Duration
	// Reconnect shapes the backoff of the listener's reconnects and of the notifier after a
	// failed send.
	Reconnect wakeup.Reconnect
	// ProbeTimeout bounds New's self-probe: how long it waits for its own NOTIFY on its
	// LISTEN connection (on a direct connection it arrives within milliseconds). Default
	// DefaultProbeTimeout (5s); negative is a configuration error.
	ProbeTimeout time.Duration
}

func (c *Config) setDefaults() {
	if c.Channel == "" {
		c.Channel = DefaultChannel
	}
	if c.ListenerApplicationName == "" {
		c.ListenerApplicationName = DefaultListenerApplicationName
	}
	if c.NotifierApplicationName == "" {
		c.NotifierApplicationName = DefaultNotifierApplicationName
	}
	if c.PingInterval == 0 {
		c.PingInterval = DefaultPingInterval
	}
	if c.Window == 0 {
		c.Window = wakeup.DefaultWindow
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
}

// Validate returns a *outbox.ConfigError naming the first invalid field, or nil. Zero fields
// are valid.
func (c Config) Validate() error {
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "pgnotify.Config." + field, Reason: reason}
	}
	switch {
	case len(c.Channel) > 63 || slices.Contains([]byte(c.Channel), 0):
		return bad("Channel", "at most 63 bytes, no NUL")
	case c.Mode != AfterCommit && c.Mode != InTransaction:
		return bad("Mode", fmt.Sprintf("unknown mode %d", int(c.Mode)))
	case c.Window < 0:
		return bad("Window", "must not be negative")
	case c.PingInterval < 0:
		return bad("PingInterval", "must not be negative")
	case c.ProbeTimeout < 0:
		return bad("ProbeTimeout", "must not be negative")
	}
	return c.Reconnect.Validate("pgnotify.Config.Reconnect")
}

// Wakeup is the LISTEN/NOTIFY wakeup: a wakeup.Wakeup (give it to outbox.SubscriberConfig.Wakeup
// and to RunInTx) and, in InTransaction mode, a wakeup.PublisherConfigurer. Safe for concurrent
// use.
type Wakeup struct {
	*wakeup.TransportWakeup
	cfg      Config
	listenCC *pgx.ConnConfig
	notifyCC *pgx.ConnConfig
	notifier *pgx.Conn // used by the coalescer's goroutine only
	logger   watermill.LoggerAdapter
}

// New returns a Wakeup whose connections are made from connConfig (copied; it must come from
// pgx.ParseConfig, e.g. pool.Config().ConnConfig of a pgxpool, and point directly at
// PostgreSQL, not at a transaction-mode pooler). It connects once to check that the server
// supports NOTIFY and LISTEN, inside a transaction it rolls back (so nothing is delivered); in
// AfterCommit mode that connection becomes the notifier's. Then it probes: a second
// connection LISTENs, the first sends one NOTIFY with a payload naming no topic, and New waits
// up to Config.ProbeTimeout for it (a round trip on a direct connection). The listener
// connects on the first Listen call. A nil logger means watermill.NopLogger.
//
// Errors: a *outbox.ConfigError for an invalid config, or wrapping ErrNotifyUnsupported when
// the server refuses pg_notify, or wrapping ErrProbeFailed when the probe's notification did
// not arrive (connConfig goes through a transaction-mode pooler: give a direct DSN); an error
// wrapping ErrListenUnsupported when it refuses LISTEN; the connection error otherwise.
func New(ctx context.Context, connConfig *pgx.ConnConfig, cfg Config, logger watermill.LoggerAdapter) (*Wakeup, error) {
	if connConfig == nil {
		return nil, &outbox.ConfigError{Field: "pgnotify.New: connConfig", Reason: "nil connection config"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	logger = logger.With(watermill.LogFields{"pg_channel": cfg.Channel})
	w := &Wakeup{cfg: cfg, logger: logger}
	w.listenCC = connConfigFor(connConfig, cfg.ListenerApplicationName)
	w.notifyCC = connConfigFor(connConfig, cfg.NotifierApplicationName)

	conn, err := pgx.ConnectConfig(ctx, w.notifyCC)
	if err != nil {
		return nil, fmt.Errorf("pgnotify: connect: %w", err)
	}
	if err := check(ctx, conn, cfg.Channel); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	if err := w.probe(ctx, conn); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	t := wakeup.Transport{
		Name:      "pgnotify",
		Listen:    w.listen,
		Window:    cfg.Window,
		Reconnect: cfg.Reconnect,
		Logger:    logger,
		Close:     w.closeNotifier,
	}
	if cfg.Mode == AfterCommit {
		w.notifier = conn
		t.Send = w.send
	} else {
		_ = conn.Close(ctx)
	}
	w.TransportWakeup = wakeup.FromTransport(t)
	return w, nil
}

// Channel returns the LISTEN/NOTIFY channel.
func (w *Wakeup) Channel() string { return w.cfg.Channel }

// Mode returns the writer side's mode.
func (w *Wakeup) Mode() Mode { return w.cfg.Mode }

// PublisherConfig implements wakeup.PublisherConfigurer: in InTransaction mode it returns cfg
// with NotifyChannel set to the channel (the publisher then folds pg_notify into its INSERT);
// in AfterCommit mode cfg unchanged. Use it for publishers built outside RunInTx/Collector.
func (w *Wakeup) PublisherConfig(cfg outbox.PublisherConfig) outbox.PublisherConfig {
	if w.cfg.Mode == InTransaction {
		cfg.NotifyChannel = w.cfg.Channel
	}
	return cfg
}

// InTransactionConfig returns cfg with NotifyChannel set to channel: the in-transaction writer
// side without a Wakeup value (a writer process that runs no relay). channel "" means
// DefaultChannel.
func InTransactionConfig(cfg outbox.PublisherConfig, channel string) outbox.PublisherConfig {
	if channel == "" {
		channel = DefaultChannel
	}
	cfg.NotifyChannel = channel
	return cfg
}

func connConfigFor(base *pgx.ConnConfig, appName string) *pgx.ConnConfig {
	cc := base.Copy()
	rp := make(map[string]string, len(cc.RuntimeParams)+2)
	for k, v := range cc.RuntimeParams {
		rp[k] = v
	}
	rp["application_name"] = appName
	cc.RuntimeParams = rp
	// Cancel a wait by a socket deadline, never by a cancel request: a cancel request that
	// arrives late would cancel the next statement.
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return cc
}

// check runs pg_notify and LISTEN in a transaction it rolls back: nothing is delivered and the
// session keeps listening to nothing.
func check(ctx context.Context, conn *pgx.Conn, channel string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgnotify: check: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", pgx.QueryExecModeExec, channel); err != nil {
		if unsupported(err) {
			return &outbox.ConfigError{Field: "pgnotify.New: connConfig", Reason: "the server refuses pg_notify",
				Err: fmt.Errorf("%w: %w", ErrNotifyUnsupported, err)}
		}
		return fmt.Errorf("pgnotify: check NOTIFY: %w", err)
	}
	if _, err := tx.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize(), pgx.QueryExecModeSimpleProtocol); err != nil {
		if unsupported(err) {
			return fmt.Errorf("%w: %w", ErrListenUnsupported, err)
		}
		return fmt.Errorf("pgnotify: check LISTEN: %w", err)
	}
	return nil
}

// probePayload starts the self-probe's payload: a relay dispatches it as a topic name, which no
// subscription serves (it wakes nobody).
const probePayload = "\x01pgnotify-self-probe "

// probe checks that a NOTIFY sent from notifier reaches a fresh listener connection within
// ProbeTimeout; it fails with ErrProbeFailed when the listener's session is not kept (a
// transaction-mode pooler).
func (w *Wakeup) probe(ctx context.Context, notifier *pgx.Conn) error {
	// The listener's settings under an application_name of its own (pg_stat_activity tells it
	// from the real listener while its backend exits).
	l, err := pgx.ConnectConfig(ctx, connConfigFor(w.listenCC, w.cfg.ListenerApplicationName+"-probe"))
	if err != nil {
		return fmt.Errorf("pgnotify: self-probe: connect listener: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = l.Close(cctx)
		cancel()
	}()
	if _, err := l.Exec(ctx, "LISTEN "+pgx.Identifier{w.cfg.Channel}.Sanitize(), pgx.QueryExecModeSimpleProtocol); err != nil {
		if unsupported(err) {
			return fmt.Errorf("%w: %w", ErrListenUnsupported, err)
		}
		return fmt.Errorf("pgnotify: self-probe: LISTEN: %w", err)
	}
	payload := fmt.Sprintf("%s%d.%d", probePayload, l.PgConn().PID(), time.Now().UnixNano())
	if _, err := notifier.Exec(ctx, "SELECT pg_notify($1, $2)", pgx.QueryExecModeSimpleProtocol, w.cfg.Channel, payload); err != nil {
		return fmt.Errorf("pgnotify: self-probe: NOTIFY: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, w.cfg.ProbeTimeout)
	defer cancel()
	for {
		n, err := l.WaitForNotification(pctx)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("pgnotify: self-probe: %w", ctx.Err())
			}
			return &outbox.ConfigError{Field: "pgnotify.New: connConfig",
				Reason: fmt.Sprintf("a NOTIFY on channel %q did not reach the LISTEN connection within %s (%v): the listener's connection does not keep its session, as behind a transaction-mode pooler (PgBouncer pool_mode=transaction); give pgnotify.New a separate DSN that connects directly to PostgreSQL (or through a session-mode pooler), and keep the pooler's DSN for the pool", w.cfg.Channel, w.cfg.ProbeTimeout, err),
				Err:    ErrProbeFailed}
		}
		if n.Channel == w.cfg.Channel && n.Payload == payload {
			return nil
		}
	}
}

// unsupported reports whether err is the server's refusal of LISTEN/NOTIFY: feature not
// supported (a PostgreSQL-compatible database), read-only / during recovery (a hot standby),
// unknown function or syntax (a database without them).
func unsupported(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "0A000", "25006", "42883", "42601", "42501":
		return true
	}
	return false
}

// send is the after-commit notifier: one statement notifying each topic once. Called from the
// coalescer's goroutine only.
func (w *Wakeup) send(ctx context.Context, topics []string) error {
	payloads := make([]string, 0, len(topics))
	for _, t := range topics {
		if len(t) > outbox.MaxNotifyTopicBytes {
			t = ""
		}
		if !slices.Contains(payloads, t) {
			payloads = append(payloads, t)
		}
	}
	if slices.Contains(payloads, "") {
		payloads = []string{""}
	}
	// A connection that sat idle may have been closed by the server meanwhile
	// (idle_session_timeout, a failover, a firewall): that is found only by using it, so a
	// failure on a reused connection is tried once more on a new one (a notification sent
	// twice costs one extra poll; one lost waits for the relays' next poll).
	for attempt := 0; ; attempt++ {
		fresh := false
		if w.notifier == nil || w.notifier.IsClosed() {
			conn, err := pgx.ConnectConfig(ctx, w.notifyCC)
			if err != nil {
				return fmt.Errorf("pgnotify: connect notifier: %w", err)
			}
			w.notifier, fresh = conn, true
		}
		// A notification is not data: the statement's own commit need not wait for the WAL
		// flush. The setting is local to that transaction (not a session setting nor a
		// startup parameter, which a transaction-mode pooler would refuse or leak).
		_, err := w.notifier.Exec(ctx, "SELECT set_config('synchronous_commit', 'off', true), count(pg_notify($1, t)) FROM unnest($2::text[]) t", w.cfg.Channel, payloads)
		if err == nil {
			return nil
		}
		_ = w.notifier.Close(context.WithoutCancel(ctx))
		w.notifier = nil
		if fresh || attempt > 0 || ctx.Err() != nil {
			return fmt.Errorf("pgnotify: notify: %w", err)
		}
	}
}

func (w *Wakeup) closeNotifier() error {
	if w.notifier == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := w.notifier.Close(ctx)
	w.notifier = nil
	return err
}

// listen is one listener session: connect, LISTEN, then dispatch every notification's payload
// until the connection fails. The connection never opens a transaction.
func (w *Wakeup) listen(ctx context.Context, hub *wakeup.Hub, subscribed func()) error {
	conn, err := pgx.ConnectConfig(ctx, w.listenCC)
	if err != nil {
		return fmt.Errorf("pgnotify: connect listener: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{w.cfg.Channel}.Sanitize(), pgx.QueryExecModeSimpleProtocol); err != nil {
		if unsupported(err) {
			return fmt.Errorf("%w: %w", ErrListenUnsupported, err)
		}
		return fmt.Errorf("pgnotify: LISTEN: %w", err)
	}
	subscribed()
	for {
		wctx, cancel := context.WithTimeout(ctx, w.cfg.PingInterval)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			if n.Channel == w.cfg.Channel {
				hub.Dispatch(n.Payload)
			}
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil && !conn.IsClosed():
			// Idle for PingInterval: check the connection.
			pctx, cancel := context.WithTimeout(ctx, w.cfg.PingInterval)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("pgnotify: listener ping: %w", err)
			}
		default:
			return fmt.Errorf("pgnotify: listener: %w", err)
		}
	}
}

var (
	_ wakeup.Wakeup              = (*Wakeup)(nil)
	_ wakeup.PublisherConfigurer = (*Wakeup)(nil)
)
