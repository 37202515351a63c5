package amqpfanout_test

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/wakeup"
	"github.com/watermill-outbox/outbox/wakeup/amqpfanout"
	"github.com/watermill-outbox/outbox/wakeup/internal/wakeuptest"
)

const amqpURL = "amqp://guest:guest@127.0.0.1:5672/"

func TestAMQPFanout(t *testing.T) {
	wakeuptest.RequireTCP(t, "RabbitMQ", "127.0.0.1:5672")
	wakeuptest.Run(t, wakeuptest.Case{
		New: func(t *testing.T) wakeup.Wakeup {
			name := wakeuptest.UniqueName(t, "wk")
			w, err := amqpfanout.New(amqpURL, amqpfanout.Config{
				Exchange:               name,
				ListenerConnectionName: name,
				Reconnect:              wakeup.Reconnect{InitialBackoff: wakeuptest.ReconnectBackoff},
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { deleteExchange(t, name) })
			return w
		},
		Kill: func(t *testing.T, w wakeup.Wakeup) {
			// The listener's connection is named after the exchange in this suite.
			name := w.(*amqpfanout.Wakeup).Exchange()
			if _, err := exec.LookPath("rabbitmqctl"); err != nil {
				if os.Getenv("CI") == "true" {
					t.Fatal("rabbitmqctl not found and CI=true: cannot close the listener's connection from the broker side")
				}
				t.Skip("rabbitmqctl not found: cannot close the listener's connection from the broker side")
			}
			pids := connections(t, name)
			if len(pids) != 1 {
				t.Fatalf("listener connections named %s: %v, want 1", name, pids)
			}
			if out, err := exec.Command("rabbitmqctl", "close_connection", pids[0], "wakeup reconnect test").CombinedOutput(); err != nil {
				t.Fatalf("close_connection: %v: %s", err, out)
			}
			// The listener reconnects after its backoff under the same name: wait for the old one
			// to be gone.
			pgtest.Eventually(t, 10*time.Second, "listener connection closed", func() bool { return !slices.Contains(connections(t, name), pids[0]) })
		},
	})
}

// connections returns the broker pids of the connections named name.
func connections(t *testing.T, name string) []string {
	out, err := exec.Command("rabbitmqctl", "list_connections", "-q", "--no-table-headers", "pid", "client_properties").Output()
	if err != nil {
		t.Fatalf("list_connections: %v", err)
	}
	var pids []string
	for _, line := range strings.Split(string(out), "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if ok && strings.Contains(props, `{"connection_name","`+name+`"}`) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func deleteExchange(t *testing.T, name string) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Errorf("delete exchange: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDelete(name, false, false)
	}
	if err != nil {
		t.Errorf("delete exchange %s: %v", name, err)
	}
}

func TestConfig(t *testing.T) {
	if _, err := amqpfanout.New("", amqpfanout.Config{}, nil); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("New(\"\") = %v", err)
	}
	for field, cfg := range map[string]amqpfanout.Config{
		"amqpfanout.Config.MaxQueueLength":           {MaxQueueLength: -1},
		"amqpfanout.Config.Window":                   {Window: -1},
		"amqpfanout.Config.Reconnect.InitialBackoff": {Reconnect: wakeup.Reconnect{InitialBackoff: -1}},
	} {
		var ce *outbox.ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s: Validate = %v", field, err)
		}
	}
}
