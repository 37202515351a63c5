package router_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/router"
)

// TestUnavailableNamedByRoute: a destination's unavailable error comes back named after its
// route (Name, else the route's Topic, "default" for Default) with its RetryAfter and cause,
// through Publish and PublishBatch; other errors and other routes' results are unchanged.
func TestUnavailableNamedByRoute(t *testing.T) {
	cause := errors.New("connection refused")
	down := forwarder.Func(func(context.Context, *message.Message) error {
		return &outbox.UnavailableError{Destination: "redis 127.0.0.1:1", RetryAfter: 3 * time.Second, Err: cause}
	})
	broken := forwarder.Func(func(context.Context, *message.Message) error { return cause })
	up := &batchRec{rec: rec{name: "up"}}
	rt, err := router.New(router.Config{
		Routes: []router.Route{
			{Topic: "orders.*", Publisher: down},
			{Topic: "billing.*", Name: "billing-redis", Publisher: down},
			{Topic: "audit", Publisher: broken},
			{Topic: "ok.*", Publisher: up},
		},
		Default: down,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantNamed := func(what string, err error, name string) {
		t.Helper()
		var ue *outbox.UnavailableError
		if !errors.As(err, &ue) || ue.Destination != name || ue.RetryAfter != 3*time.Second || !errors.Is(err, cause) {
			t.Errorf("%s: %v, want unavailable of %q after 3s wrapping the cause", what, err, name)
		}
	}
	msg := func() *message.Message { return outbox.NewMessage([]byte(`{}`)) }
	wantNamed("orders", rt.Publish("orders.created", msg()), "orders.*")
	wantNamed("billing", rt.Publish("billing.paid", msg()), "billing-redis")
	wantNamed("default", rt.Publish("other", msg()), router.DefaultRouteName)
	if err := rt.Publish("audit", msg()); err != cause {
		t.Errorf("ordinary failure: %v, want the cause unchanged", err)
	}

	batch := []forwarder.Outgoing{{Topic: "ok.a", Message: msg()}, {Topic: "orders.x", Message: msg()}, {Topic: "billing.y", Message: msg()}, {Topic: "audit", Message: msg()}}
	errs := rt.PublishBatch(context.Background(), batch)
	if errs[0] != nil || errs[3] != cause {
		t.Errorf("batch: %v", errs)
	}
	wantNamed("batch orders", errs[1], "orders.*")
	wantNamed("batch billing", errs[2], "billing-redis")
}
