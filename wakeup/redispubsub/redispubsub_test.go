package redispubsub_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/wakeup"
	"github.com/watermill-outbox/outbox/wakeup/internal/wakeuptest"
	"github.com/watermill-outbox/outbox/wakeup/redispubsub"
)

const redisAddr = "127.0.0.1:6379"

func TestRedisPubSub(t *testing.T) {
	wakeuptest.RequireTCP(t, "Redis", redisAddr)
	wakeuptest.Run(t, wakeuptest.Case{
		New: func(t *testing.T) wakeup.Wakeup {
			name := wakeuptest.UniqueName(t, "wk")
			client := redis.NewClient(&redis.Options{Addr: redisAddr, ClientName: name})
			t.Cleanup(func() { _ = client.Close() })
			w, err := redispubsub.New(client, redispubsub.Config{
				Channel:   name,
				Reconnect: wakeup.Reconnect{InitialBackoff: wakeuptest.ReconnectBackoff},
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return w
		},
		KillLosesSignals: true,
		Kill: func(t *testing.T, w wakeup.Wakeup) {
			name := w.(*redispubsub.Wakeup).Channel() // the client name in this suite
			admin := redis.NewClient(&redis.Options{Addr: redisAddr})
			defer admin.Close()
			ctx := context.Background()
			ids := pubsubClients(t, admin, name)
			if len(ids) != 1 {
				t.Fatalf("listener connections named %s: %v, want 1", name, ids)
			}
			if err := admin.Do(ctx, "CLIENT", "KILL", "ID", ids[0]).Err(); err != nil {
				t.Fatal(err)
			}
			pgtest.Eventually(t, 5*time.Second, "listener connection gone", func() bool { return !slices.Contains(pubsubClients(t, admin, name), ids[0]) })
		},
	})
}

// pubsubClients returns the ids of the pub/sub connections named name.
func pubsubClients(t *testing.T, admin *redis.Client, name string) []string {
	list, err := admin.Do(context.Background(), "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range strings.Split(list, "\n") {
		fields := map[string]string{}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				fields[k] = v
			}
		}
		if fields["name"] == name {
			ids = append(ids, fields["id"])
		}
	}
	return ids
}

func TestConfig(t *testing.T) {
	if _, err := redispubsub.New(nil, redispubsub.Config{}, nil); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("New(nil) = %v", err)
	}
	for field, cfg := range map[string]redispubsub.Config{
		"redispubsub.Config.Window":               {Window: -1},
		"redispubsub.Config.PingInterval":         {PingInterval: -1},
		"redispubsub.Config.Reconnect.MaxBackoff": {Reconnect: wakeup.Reconnect{MaxBackoff: -1}},
	} {
		var ce *outbox.ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s: Validate = %v", field, err)
		}
	}
	if err := (redispubsub.Config{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
}
