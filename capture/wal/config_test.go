package wal_test

import (
	"errors"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/capture/wal"
)

// TestValidate: Config.Validate refuses, with a *outbox.ConfigError naming the field, what the
// WAL source cannot do or what is malformed; the zero value of every other field is valid.
func TestValidate(t *testing.T) {
	ok := []capture.Table{{Name: "loan"}}
	cases := []struct {
		cfg   wal.Config
		field string
		is    error
	}{
		{wal.Config{}, "wal.Config.Tables", nil},
		{wal.Config{Tables: ok, Slot: "Bad-Slot"}, "wal.Config.Slot", nil},
		{wal.Config{Tables: ok, Publication: "a b"}, "wal.Config.Publication", nil},
		{wal.Config{Tables: ok, BatchSize: -1}, "wal.Config.BatchSize", nil},
		{wal.Config{Tables: ok, MaxRetainedWAL: -1}, "wal.Config.MaxRetainedWAL", nil},
		{wal.Config{Tables: ok, DeliveryTimeout: -time.Second}, "wal.Config.DeliveryTimeout", nil},
		{wal.Config{Tables: []capture.Table{{Name: "loan", Extend: capture.Extend{Headers: map[string]string{"h": "1"}}}}}, "wal.Config.Tables[0].Extend", wal.ErrUnsupported},
		{wal.Config{Tables: []capture.Table{{Name: "loan", OrderingKeySQL: "'k'"}}}, "wal.Config.Tables[0].OrderingKeySQL", wal.ErrUnsupported},
		{wal.Config{Tables: []capture.Table{{Name: "loan", LockOrderingKey: true}}}, "wal.Config.Tables[0].LockOrderingKey", wal.ErrUnsupported},
		{wal.Config{Tables: []capture.Table{{Name: "loan", Topic: "{nope}"}}}, "Table[0].Topic", capture.ErrTemplate},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || (c.is != nil && !errors.Is(err, c.is)) {
			t.Errorf("%+v: %v, want a *outbox.ConfigError on %s", c.cfg, err, c.field)
		}
	}
	if err := (wal.Config{Tables: ok}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestValidateOutbox: OutboxConfig.Validate names the OutboxConfig field (or the Relay's
// SubscriberConfig field) it refuses; the zero value is valid.
func TestValidateOutbox(t *testing.T) {
	cases := []struct {
		cfg   wal.OutboxConfig
		field string
	}{
		{wal.OutboxConfig{Slot: "Bad-Slot"}, "wal.OutboxConfig.Slot"},
		{wal.OutboxConfig{BatchSize: -1}, "wal.OutboxConfig.BatchSize"},
		{wal.OutboxConfig{DeliveryTimeout: -time.Second}, "wal.OutboxConfig.DeliveryTimeout"},
		{wal.OutboxConfig{LeaseDuration: -time.Second}, "wal.OutboxConfig.LeaseDuration"},
		{wal.OutboxConfig{LeaseDuration: time.Millisecond}, "wal.OutboxConfig.LeaseDuration"},
		{wal.OutboxConfig{SweepInterval: -time.Second}, "wal.OutboxConfig.SweepInterval"},
		{wal.OutboxConfig{Relay: outbox.SubscriberConfig{BatchSize: -1}}, "SubscriberConfig.BatchSize"},
		// The stream would deliver, and mark published, the excluded topics' events.
		{wal.OutboxConfig{Relay: outbox.SubscriberConfig{ExcludeTopics: []string{"payments*"}}}, "wal.OutboxConfig.Relay.ExcludeTopics"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%+v: %v, want a *outbox.ConfigError on %s", c.cfg, err, c.field)
		}
	}
	if err := (wal.OutboxConfig{}).Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := wal.NewOutboxRelay(nil, wal.OutboxConfig{}); err == nil {
		t.Fatal("NewOutboxRelay without a Destination: no error")
	}
}
