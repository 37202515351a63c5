// Package console serves the outbox's operator console: server-rendered HTML pages (no
// JavaScript needed, no external assets, usable offline and on a phone) that show the backlog
// per topic, the ordering keys held behind a failed head, the dead letters, the destinations'
// outages and an audit log, and that act on them (retry, skip or purge a key's head; retry or
// purge every dead letter a filter matches; replay the published events of a window after a
// dry-run count) through the root package's operations — the same ones the API and the
// `outbox` command use.
//
// The console is read-only unless Config.Token or Config.BasicAuth is set: every action then
// needs it, and otherwise answers 403 Forbidden. Actions are POST forms protected against
// cross-site request forgery (a token in a form field tied to a cookie, and a refusal of
// cross-site requests by their Origin and Sec-Fetch-Site headers). Every action is recorded in
// an audit table (Config.AuditTable) that Migrate creates.
//
// Mount it with http.Handle or serve it alone (`outbox console --db URL`):
//
//	c, err := console.New(console.Config{DB: pool, Token: os.Getenv("OUTBOX_CONSOLE_TOKEN")})
//	if err != nil { … }
//	if err := c.Migrate(ctx); err != nil { … }
//	http.ListenAndServe("127.0.0.1:8080", c)
//
// Every page works on PostgreSQL, SQLite and MariaDB/MySQL; the audit table's DDL is the
// database's own (AuditSQLFor).
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox"
)

//go:embed templates/*.html static/style.css
var assets embed.FS

// OutageSource is what the destinations page reads: *outbox.Subscriber and
// *outbox.MultiSubscriber of the relay the console runs in.
type OutageSource interface {
	Outages() []outbox.Outage
}

// LimitSource is implemented by an OutageSource that also tells the destinations' flow
// control (*outbox.Subscriber: SubscriberConfig.DestinationLimits); the destinations page then
// lists each limited destination with its rate, burst and in-flight bound.
type LimitSource interface {
	DestinationLimits() map[string]outbox.DestinationLimit
}

// Config configures a Console. DB is required; the zero value of every other field is its
// default.
type Config struct {
	// DB is the outbox's database: a *pgxpool.Pool or a *sql.DB (any handle
	// outbox.NewSubscriber takes that is not a transaction).
	DB any
	// Schema names the outbox table (its Migrate config).
	Schema outbox.SchemaConfig
	// AuditTable is the audit log's table. Default: the outbox table's name (with its schema)
	// followed by "_console_audit".
	AuditTable string
	// Token, when set, lets an operator who logs in with it act (the login page sets a
	// cookie; a request may also send "Authorization: Bearer <token>"). Reading needs no
	// token. Empty: no token.
	Token string
	// BasicAuth, "user:password", when set, guards every page with HTTP basic authentication
	// and lets the authenticated user act. Empty: none.
	BasicAuth string
	// ShowPayloads shows the dead letters' payloads on their detail page; otherwise a payload
	// is never sent to the browser (only its size). Headers are always shown.
	ShowPayloads bool
	// Outages lists the destinations' outages when the console runs inside a relay (and their
	// flow control when it is also a LimitSource); nil shows "n/a" on the destinations page.
	Outages OutageSource
	// PageSize is how many dead letters and blocked keys a page lists. Default 100; at most
	// outbox.MaxBlockedKeys.
	PageSize int
	// OverviewLimit is how many events of each kind (unordered pending, keyed pending, dead
	// letters, keys with a failed event, leased events) the overview reads at most, so that
	// it answers in bounded time whatever the backlog (outbox.Subscriber.BacklogOverview and
	// RelayLeases); beyond it the overview shows its counts as lower bounds ("2,000+").
	// Default outbox.DefaultOverviewLimit (2,000); at most outbox.MaxOverviewLimit.
	OverviewLimit int
	// Logger logs one line per action; nil means watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// Validate returns an *outbox.ConfigError naming the first invalid field, or nil.
func (c Config) Validate() error {
	if c.DB == nil {
		return &outbox.ConfigError{Field: "console.Config.DB", Reason: "is required"}
	}
	if c.BasicAuth != "" {
		if u, p, ok := strings.Cut(c.BasicAuth, ":"); !ok || u == "" || p == "" {
			return &outbox.ConfigError{Field: "console.Config.BasicAuth", Reason: `must be "user:password", both non-empty`}
		}
	}
	if c.Token != "" && c.BasicAuth != "" {
		return &outbox.ConfigError{Field: "console.Config.Token", Reason: "give Token or BasicAuth, not both"}
	}
	if c.PageSize < 0 || c.PageSize > outbox.MaxBlockedKeys {
		return &outbox.ConfigError{Field: "console.Config.PageSize", Reason: fmt.Sprintf("%d outside 0..%d", c.PageSize, outbox.MaxBlockedKeys)}
	}
	if c.OverviewLimit < 0 || c.OverviewLimit > outbox.MaxOverviewLimit {
		return &outbox.ConfigError{Field: "console.Config.OverviewLimit", Reason: fmt.Sprintf("%d outside 0..%d", c.OverviewLimit, outbox.MaxOverviewLimit)}
	}
	if err := c.Schema.Validate(); err != nil {
		return err
	}
	return nil
}

// Console is the console's http.Handler. Safe for concurrent use.
type Console struct {
	cfg    Config
	sub    *outbox.Subscriber
	audit  *auditLog
	tpl    map[string]*template.Template
	mux    *http.ServeMux
	key    []byte // signs the CSRF and session values
	logger watermill.LoggerAdapter
}

// New returns a Console for cfg. It runs no SQL: call Migrate once to create the audit table.
// Errors: an *outbox.ConfigError for an invalid cfg or DB handle.
func New(cfg Config) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = 100
	}
	if cfg.OverviewLimit == 0 {
		cfg.OverviewLimit = outbox.DefaultOverviewLimit
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	sub, err := outbox.NewSubscriber(cfg.DB, outbox.SubscriberConfig{Schema: cfg.Schema}, nil)
	if err != nil {
		return nil, err
	}
	table := cfg.Schema.Table
	if table == "" {
		table = outbox.DefaultTable
	}
	if cfg.AuditTable == "" {
		cfg.AuditTable = table + "_console_audit"
	}
	audit, err := newAuditLog(cfg.DB, cfg.Schema.Dialect, cfg.AuditTable)
	if err != nil {
		_ = sub.Close()
		return nil, err
	}
	c := &Console{cfg: cfg, sub: sub, audit: audit, key: make([]byte, 32), logger: cfg.Logger.With(watermill.LogFields{"table": table})}
	_, _ = rand.Read(c.key)
	if c.tpl, err = parseTemplates(); err != nil {
		_ = sub.Close()
		return nil, err
	}
	c.routes()
	return c, nil
}

// Migrate creates the audit table unless it exists (idempotent).
func (c *Console) Migrate(ctx context.Context) error { return c.audit.migrate(ctx) }

// Close releases the console's Subscriber (it runs no relay). The database handle stays open.
func (c *Console) Close() error { return c.sub.Close() }

// ReadOnly reports whether the console refuses every action (neither Token nor BasicAuth).
func (c *Console) ReadOnly() bool { return c.cfg.Token == "" && c.cfg.BasicAuth == "" }

// ServeHTTP implements http.Handler.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	if c.cfg.BasicAuth != "" {
		if _, ok := c.basicUser(r); !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="outbox console", charset="UTF-8"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
	}
	c.mux.ServeHTTP(w, r)
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", c.overview)
	m.HandleFunc("GET /keys", c.keys)
	m.HandleFunc("POST /keys/{action}", c.action(c.keyAction))
	m.HandleFunc("GET /dead", c.dead)
	m.HandleFunc("GET /dead/confirm", c.deadConfirm)
	m.HandleFunc("POST /dead/apply", c.action(c.deadApply))
	m.HandleFunc("GET /dead/event", c.deadEvent)
	m.HandleFunc("GET /destinations", c.destinations)
	m.HandleFunc("GET /audit", c.auditPage)
	m.HandleFunc("GET /replay", c.replay)
	m.HandleFunc("GET /replay/confirm", c.replayConfirm)
	m.HandleFunc("POST /replay/apply", c.action(c.replayApply))
	m.HandleFunc("GET /login", c.loginPage)
	m.HandleFunc("POST /login", c.login)
	m.HandleFunc("POST /logout", c.logout)
	m.HandleFunc("GET /static/style.css", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("Cache-Control", "max-age=3600")
		b, _ := assets.ReadFile("static/style.css")
		_, _ = w.Write(b)
	})
	c.mux = m
}

// errStatus is an error with the HTTP status to answer.
type errStatus struct {
	code int
	msg  string
}

func (e *errStatus) Error() string { return e.msg }

func forbidden(msg string) error { return &errStatus{http.StatusForbidden, msg} }

// statusOf is the HTTP status of err.
func statusOf(err error) int {
	var es *errStatus
	switch {
	case errors.As(err, &es):
		return es.code
	case errors.Is(err, outbox.ErrConfig), errors.Is(err, outbox.ErrEmptyFilter):
		return http.StatusBadRequest
	case errors.Is(err, outbox.ErrHeadMoved):
		return http.StatusConflict
	case errors.Is(err, outbox.ErrNotSupported):
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// ago renders a duration for people: "3.2s", "4m10s", "2h5m", "3d4h".
func ago(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}
