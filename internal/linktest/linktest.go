// Package linktest checks, from the tests of a public dialect package (outbox/sqlite,
// outbox/mysql), what a program gets from importing that package: its dialect works, and a
// dialect whose package the program does not import is refused before any SQL.
package linktest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/watermill-outbox/outbox"
)

// opens counts the connections asked of the "linktest" driver.
var opens atomic.Int64

// refusingDriver is a database/sql driver that refuses every connection and counts the
// attempts: a statement run through its *sql.DB shows as a nonzero count.
type refusingDriver struct{}

func (refusingDriver) Open(string) (driver.Conn, error) {
	opens.Add(1)
	return nil, errors.New("linktest: no database")
}

func init() { sql.Register("linktest", refusingDriver{}) }

// Linked checks that d is usable: its SchemaConfig validates and its Capabilities are want.
func Linked(t *testing.T, d outbox.Dialect, want outbox.Capabilities) {
	t.Helper()
	if err := (outbox.SchemaConfig{Dialect: d}).Validate(); err != nil {
		t.Errorf("%s: Validate: %v", d, err)
	}
	if got := d.Capabilities(); got != want {
		t.Errorf("%s: Capabilities() = %+v, want %+v", d, got, want)
	}
}

// Unlinked checks that d, whose package pkg the test binary does not import, has the zero
// Capabilities and is refused by SchemaConfig.Validate, NewPublisher, NewSubscriber and Migrate
// with a *outbox.ConfigError naming pkg, before any connection is opened.
func Unlinked(t *testing.T, d outbox.Dialect, pkg string) {
	t.Helper()
	db, err := sql.Open("linktest", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := d.Capabilities(); got != (outbox.Capabilities{}) {
		t.Errorf("%s: Capabilities() = %+v, want the zero value", d, got)
	}
	schema := outbox.SchemaConfig{Dialect: d}
	calls := map[string]func() error{
		"Validate": schema.Validate,
		"NewPublisher": func() error {
			_, err := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
			return err
		},
		"NewSubscriber": func() error {
			_, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
			return err
		},
		"Migrate": func() error { return outbox.Migrate(context.Background(), db, schema) },
	}
	wantReason := fmt.Sprintf("the %s dialect is not linked into the program: add import _ %q", d, pkg)
	before := opens.Load()
	for name, call := range calls {
		err := call()
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != "SchemaConfig.Dialect" || ce.Reason != wantReason || ce.Err != nil {
			t.Errorf("%s(%s) = %v, want the *outbox.ConfigError of SchemaConfig.Dialect %q", name, d, err, wantReason)
		}
	}
	if n := opens.Load() - before; n != 0 {
		t.Errorf("%d connections opened, want none: the dialect must be checked before any SQL", n)
	}
}
