package main

import (
	"errors"
	"testing"

	"github.com/watermill-outbox/outbox"
)

// TestParseDBURL: every accepted --db form and the refused ones (no database involved).
func TestParseDBURL(t *testing.T) {
	for _, tc := range []struct {
		in      string
		dialect outbox.Dialect
		path    string
		host    string
	}{
		{in: "postgres://u:p@db.internal:6432/app?sslmode=disable", dialect: outbox.DialectPostgreSQL, host: "db.internal:6432"},
		{in: "postgresql://u@127.0.0.1/app", dialect: outbox.DialectPostgreSQL, host: "127.0.0.1:5432"},
		{in: "POSTGRES://u@[::1]:5433/app", dialect: outbox.DialectPostgreSQL, host: "[::1]:5433"},
		{in: "sqlite:///var/lib/outbox.db", dialect: outbox.DialectSQLite, path: "/var/lib/outbox.db"},
		{in: "sqlite://rel/outbox.db", dialect: outbox.DialectSQLite, path: "rel/outbox.db"},
		{in: "sqlite:outbox.db", dialect: outbox.DialectSQLite, path: "outbox.db"},
		{in: "sqlite:/tmp/x", dialect: outbox.DialectSQLite, path: "/tmp/x"},
		{in: "file:/tmp/x.sqlite?mode=rwc", dialect: outbox.DialectSQLite, path: "/tmp/x.sqlite"},
		{in: "./data/outbox.db", dialect: outbox.DialectSQLite, path: "./data/outbox.db"},
		{in: "/abs/outbox.sqlite", dialect: outbox.DialectSQLite, path: "/abs/outbox.sqlite"},
		{in: "outbox.sqlite3", dialect: outbox.DialectSQLite, path: "outbox.sqlite3"},
	} {
		u, err := parseDBURL(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if u.Dialect() != tc.dialect || u.File() != tc.path {
			t.Errorf("%s: dialect %v path %q, want %v %q", tc.in, u.Dialect(), u.File(), tc.dialect, tc.path)
		}
		if tc.host != "" {
			if got := u.HostPort(); got != tc.host {
				t.Errorf("%s: host %q, want %q", tc.in, got, tc.host)
			}
		}
	}
	for _, in := range []string{"", "sqlserver://sa@127.0.0.1/x", "outbox", "sqlite://", "sqlite::memory:", "file::memory:?cache=shared",
		"redis://127.0.0.1:6379", "postgres://u@127.0.0.1:notaport/x", "http://example.com/x.db"} {
		_, err := parseDBURL(in)
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: error %v, want a usage error", in, err)
		}
	}
}

// TestParseDestURL: the accepted --to forms and the refused ones.
func TestParseDestURL(t *testing.T) {
	for in, kind := range map[string]destKind{
		"kafka://127.0.0.1:9092,127.0.0.1:9093": destKafka,
		"amqp://guest:guest@127.0.0.1:5672/":    destAMQP,
		"amqps://u:p@mq.internal:5671/vhost":    destAMQP,
		"redis://127.0.0.1:6379/2":              destRedis,
		"rediss://u:p@cache.internal:6380":      destRedis,
		"http://127.0.0.1:8080/hook":            destHTTP,
		"https://hooks.example.com/orders":      destHTTP,
	} {
		d, err := parseDestURL(in)
		if err != nil || d.kind != kind {
			t.Errorf("%s: kind %v, error %v; want %v", in, d.kind, err, kind)
		}
	}
	d, _ := parseDestURL("kafka://a:1,b:2")
	if len(d.brokers) != 2 || d.brokers[0] != "a:1" || d.brokers[1] != "b:2" {
		t.Errorf("brokers %v", d.brokers)
	}
	if d, _ := parseDestURL("amqp://guest:secret@127.0.0.1:5672/"); d.shown != "amqp://guest:xxxxx@127.0.0.1:5672/" {
		t.Errorf("shown %q: the password must be hidden", d.shown)
	}
	for _, in := range []string{"", "ftp://127.0.0.1/", "kafka://", "http:///path", "nats://127.0.0.1:4222", "redis://127.0.0.1:6379/notadb"} {
		_, err := parseDestURL(in)
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: error %v, want a usage error", in, err)
		}
	}
}

// TestParsePrefixes: CIDR prefixes and single addresses.
func TestParsePrefixes(t *testing.T) {
	ps, err := parsePrefixes([]string{"127.0.0.0/8", "10.1.2.3", "::1", " "})
	if err != nil || len(ps) != 3 || ps[1].String() != "10.1.2.3/32" || ps[2].String() != "::1/128" {
		t.Fatalf("%v %v", ps, err)
	}
	if _, err := parsePrefixes([]string{"localhost"}); err == nil {
		t.Fatal("a host name was accepted")
	}
}
