package redisstream

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
)

func TestConfigValidate(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	cases := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"options", Config{Options: &redis.Options{Addr: "127.0.0.1:6379"}}, ""},
		{"client", Config{Client: client, MaxLen: 100}, ""},
		{"neither", Config{}, "redisstream.Config.Options"},
		{"both", Config{Options: &redis.Options{}, Client: client}, "redisstream.Config.Client"},
		{"negative maxlen", Config{Client: client, MaxLen: -1}, "redisstream.Config.MaxLen"},
		{"negative max entry bytes", Config{Client: client, MaxEntryBytes: -1}, "redisstream.Config.MaxEntryBytes"},
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

func TestOwnClientHasNoRetries(t *testing.T) {
	p, err := NewPublisher(Config{Options: &redis.Options{Addr: "127.0.0.1:1", MaxRetries: 5}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := p.client.(*redis.Client).Options().MaxRetries; got != 0 {
		t.Fatalf("MaxRetries = %d after -1 (go-redis stores -1 as 0)", got)
	}
}
