package amqp

import (
	"errors"
	"strings"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"url", Config{URL: "amqp://127.0.0.1"}, ""},
		{"connection", Config{Connection: &amqp091.Connection{}}, ""},
		{"neither", Config{}, "amqp.Config.URL"},
		{"both", Config{URL: "amqp://127.0.0.1", Connection: &amqp091.Connection{}}, "amqp.Config.Connection"},
		{"negative channels", Config{URL: "amqp://127.0.0.1", Channels: -1}, "amqp.Config.Channels"},
		{"too many channels", Config{URL: "amqp://127.0.0.1", Channels: 1025}, "amqp.Config.Channels"},
		{"negative max message bytes", Config{URL: "amqp://127.0.0.1", MaxMessageBytes: -1}, "amqp.Config.MaxMessageBytes"},
		{"exchange 256 bytes", Config{URL: "amqp://127.0.0.1", Exchange: strings.Repeat("x", 256)}, "amqp.Config.Exchange"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ce *outbox.ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("Validate = %v, want ConfigError on %s", err, c.field)
			}
		})
	}
}

func TestReturnedError(t *testing.T) {
	var err error = &ReturnedError{ReplyCode: 312, ReplyText: "NO_ROUTE", Exchange: "x", RoutingKey: "k"}
	if !errors.Is(err, ErrUnroutable) {
		t.Fatal("ReturnedError does not match ErrUnroutable")
	}
}
