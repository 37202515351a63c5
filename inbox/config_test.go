package inbox_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
)

func TestConfigValidate(t *testing.T) {
	ok := inbox.Config{Consumer: "c"}
	for _, tc := range []struct {
		name  string
		mod   func(*inbox.Config)
		field string // "" = valid
	}{
		{"minimal", func(*inbox.Config) {}, ""},
		{"no consumer", func(c *inbox.Config) { c.Consumer = "" }, "inbox.Config.Consumer"},
		{"long consumer", func(c *inbox.Config) { c.Consumer = strings.Repeat("c", 256) }, "inbox.Config.Consumer"},
		{"negative retries", func(c *inbox.Config) { c.MaxRetries = -1 }, "inbox.Config.MaxRetries"},
		{"negative base", func(c *inbox.Config) { c.RetryBase = -time.Second }, "inbox.Config.RetryBase"},
		{"negative max", func(c *inbox.Config) { c.RetryMax = -time.Second }, "inbox.Config.RetryMax"},
		{"max below base", func(c *inbox.Config) { c.RetryBase, c.RetryMax = time.Second, time.Millisecond }, "inbox.Config.RetryMax"},
		{"base above default max", func(c *inbox.Config) { c.RetryBase = 2 * time.Second }, ""},
		{"dialects differ", func(c *inbox.Config) { c.Schema.Dialect = outbox.DialectSQLite }, "inbox.Config.Outbox.Schema.Dialect"},
		{"both sqlite", func(c *inbox.Config) {
			c.Schema.Dialect, c.Outbox.Schema.Dialect = outbox.DialectSQLite, outbox.DialectSQLite
		}, ""},
		{"bad table", func(c *inbox.Config) { c.Schema.Table = "a.b.c" }, "inbox.SchemaConfig.Table"},
		{"qualified sqlite table", func(c *inbox.Config) {
			c.Schema = inbox.SchemaConfig{Table: "a.b", Dialect: outbox.DialectSQLite}
			c.Outbox.Schema.Dialect = outbox.DialectSQLite
		}, "inbox.SchemaConfig.Table"},
		{"unknown dialect", func(c *inbox.Config) { c.Schema.Dialect, c.Outbox.Schema.Dialect = 7, 7 }, "inbox.SchemaConfig.Dialect"},
		{"bad outbox config", func(c *inbox.Config) { c.Outbox.MaxOrderingKeysPerCall = -1 }, "PublisherConfig.MaxOrderingKeysPerCall"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mod(&c)
			err := c.Validate()
			var ce *outbox.ConfigError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
				t.Fatalf("want *outbox.ConfigError on %s, got %v", tc.field, err)
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	if _, err := inbox.New(inbox.DB[*sql.Tx]{}, inbox.Config{Consumer: "c"}, nil); !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("zero DB: %v", err)
	}
	db, err := sql.Open("sqlite", "file:unused.db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := inbox.New(inbox.FromSQL(db, nil), inbox.Config{Consumer: "c"}, nil); !errors.Is(err, outbox.ErrConfig) {
		t.Fatalf("SQLite driver with the PostgreSQL dialect: %v", err)
	}
	if err := inbox.Migrate(ctx, 42, inbox.SchemaConfig{}); !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("Migrate on an int: %v", err)
	}
}

func TestKeyFromMetadata(t *testing.T) {
	key := inbox.KeyFromMetadata("outbox-event-id")
	m := message.NewMessage("x", nil)
	if _, err := key(m); err == nil {
		t.Fatal("missing field: no error")
	}
	m.Metadata.Set("outbox-event-id", "e1")
	if k, err := key(m); err != nil || k != "e1" {
		t.Fatalf("key %q, %v", k, err)
	}
}
