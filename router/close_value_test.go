package router_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/router"
)

// valuePub is a publisher of a value type (comparable by its type) that wraps another
// publisher, here a forwarder.Func (a func: not hashable).
type valuePub struct{ next message.Publisher }

func (v valuePub) Publish(topic string, msgs ...*message.Message) error {
	return v.next.Publish(topic, msgs...)
}
func (v valuePub) Close() error { return v.next.Close() }

// TestCloseValuePublisherWrappingFunc: Close with CloseDestinations must close a
// value-type destination, not panic with "hash of unhashable type".
func TestCloseValuePublisherWrappingFunc(t *testing.T) {
	fn := forwarder.Func(func(context.Context, *message.Message) error { return nil })
	p, err := router.New(router.Config{Routes: []router.Route{{Topic: "a", Publisher: valuePub{next: fn}}}, CloseDestinations: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Close panicked: %v", r)
		}
	}()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
