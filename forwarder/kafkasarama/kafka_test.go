package kafkasarama

import (
	"errors"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
)

func TestConfigValidate(t *testing.T) {
	mod := func(f func(c *sarama.Config)) *sarama.Config {
		c := DefaultSaramaConfig()
		f(c)
		return c
	}
	cases := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"defaults", Config{Brokers: []string{"127.0.0.1:9092"}}, ""},
		{"no brokers", Config{}, "kafka.Config.Brokers"},
		{"acks one", Config{Brokers: []string{"b"}, SaramaConfig: mod(func(c *sarama.Config) { c.Producer.RequiredAcks = sarama.WaitForLocal })}, "kafka.Config.SaramaConfig.Producer.RequiredAcks"},
		{"not idempotent", Config{Brokers: []string{"b"}, SaramaConfig: mod(func(c *sarama.Config) { c.Producer.Idempotent = false })}, "kafka.Config.SaramaConfig.Producer.Idempotent"},
		{"no successes", Config{Brokers: []string{"b"}, SaramaConfig: mod(func(c *sarama.Config) { c.Producer.Return.Successes = false })}, "kafka.Config.SaramaConfig.Producer.Return.Successes"},
		{"no errors", Config{Brokers: []string{"b"}, SaramaConfig: mod(func(c *sarama.Config) { c.Producer.Return.Errors = false })}, "kafka.Config.SaramaConfig.Producer.Return.Errors"},
		// A partitioner that ignores the key spreads one ordering key over the partitions.
		{"round-robin partitioner", Config{Brokers: []string{"b"}, SaramaConfig: mod(func(c *sarama.Config) { c.Producer.Partitioner = sarama.NewRoundRobinPartitioner })}, "kafka.Config.SaramaConfig.Producer.Partitioner"},
		{"random partitioner", Config{Brokers: []string{"b"}, SaramaConfig: mod(func(c *sarama.Config) { c.Producer.Partitioner = sarama.NewRandomPartitioner })}, "kafka.Config.SaramaConfig.Producer.Partitioner"},
		{"hash partitioner", Config{Brokers: []string{"b"}, SaramaConfig: mod(func(c *sarama.Config) { c.Producer.Partitioner = sarama.NewHashPartitioner })}, ""},
		{"sarama refuses", Config{Brokers: []string{"b"}, SaramaConfig: mod(func(c *sarama.Config) { c.Net.MaxOpenRequests = 5 })}, "kafka.Config.SaramaConfig"},
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

func TestMarshaler(t *testing.T) {
	m := message.NewMessage("id-1", []byte("p"))
	m.Metadata.Set("h", "v")
	pm, err := Marshaler{}.Marshal("t", m)
	if err != nil || pm.Key != nil {
		t.Fatalf("unordered: key %v, err %v", pm.Key, err)
	}
	outbox.SetOrderingKey(m, "k")
	pm, err = Marshaler{}.Marshal("t", m)
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := pm.Key.Encode(); string(k) != "k" {
		t.Fatalf("key %q", k)
	}
	cm := &sarama.ConsumerMessage{Topic: "t", Value: []byte("p")}
	for _, h := range pm.Headers {
		h := h
		cm.Headers = append(cm.Headers, &h)
	}
	back, err := Marshaler{}.Unmarshal(cm)
	if err != nil || back.UUID != "id-1" || back.Metadata.Get("h") != "v" || back.Metadata.Get(outbox.MetadataOrderingKey) != "k" {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}
