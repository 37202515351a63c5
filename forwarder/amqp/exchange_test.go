package amqp

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

// TestMissingExchangeIsAnOrdinaryFailure: every message of a batch published through an
// exchange that does not exist fails as an ordinary failure (the package doc: a channel the
// broker closed for a reason, 404 here, is the message's failure; Config.Exchange: the events
// retry and dead-letter). After the first message the broker had closed the channel, and the
// rest failed on the client as "channel/connection is not open" and came back as not attempted
// (499 of 500): released without an attempt and claimed again at once, a channel opened and
// closed by the broker per round.
func TestMissingExchangeIsAnOrdinaryFailure(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	ex := fmt.Sprintf("outbox-missing-%d", time.Now().UnixNano())
	p, err := NewPublisher(Config{URL: url, Exchange: ex, Channels: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	batch := make([]forwarder.Outgoing, 500)
	for i := range batch {
		batch[i] = forwarder.Outgoing{Topic: "t", Message: outbox.NewMessage([]byte(`{}`))}
	}
	free, ordinary := 0, 0
	var firstFree error
	for i, err := range p.PublishBatch(context.Background(), batch) {
		switch {
		case err == nil:
			t.Fatalf("message %d delivered through a missing exchange", i)
		case errors.Is(err, outbox.ErrNotAttempted), errors.Is(err, outbox.ErrUnavailable):
			free++
			if firstFree == nil {
				firstFree = err
			}
		default:
			ordinary++
		}
	}
	if free > 0 || ordinary != len(batch) {
		t.Fatalf("%d of %d messages to a missing exchange count no attempt (e.g. %v), %d are ordinary failures", free, len(batch), firstFree, ordinary)
	}
}
