package kafkasignal_test

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
	"github.com/watermill-outbox/outbox/wakeup/internal/wakeuptest"
	"github.com/watermill-outbox/outbox/wakeup/kafkasignal"
)

func TestKafkaSignal(t *testing.T) {
	wakeuptest.Run(t, wakeuptest.Case{
		New: func(t *testing.T) wakeup.Wakeup {
			topic := wakeuptest.UniqueName(t, "wk")
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
			if err != nil {
				t.Fatal(err)
			}
			w, err := kafkasignal.New(kafkasignal.Config{
				Brokers:   cluster.ListenAddrs(),
				Topic:     topic,
				Reconnect: wakeup.Reconnect{InitialBackoff: wakeuptest.ReconnectBackoff},
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Registered before the suite's Close of w, so it runs after it.
			t.Cleanup(cluster.Close)
			return w
		},
	})
}

func TestConfig(t *testing.T) {
	for field, cfg := range map[string]kafkasignal.Config{
		"kafkasignal.Config.Brokers":                  {},
		"kafkasignal.Config.Window":                   {Brokers: []string{"127.0.0.1:9092"}, Window: -1},
		"kafkasignal.Config.Reconnect.InitialBackoff": {Brokers: []string{"127.0.0.1:9092"}, Reconnect: wakeup.Reconnect{InitialBackoff: -1}},
	} {
		var ce *outbox.ConfigError
		if _, err := kafkasignal.New(cfg, nil); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s: New = %v", field, err)
		}
	}
}
