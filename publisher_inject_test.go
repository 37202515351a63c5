package outbox_test

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

type ctxKey struct{}

// TestInjectHeaders: PublisherConfig.InjectHeaders sees each write's context (ctx for Enqueue,
// the message's context for Publish) and adds headers; a header the caller set wins and the
// caller's map is not written.
func TestInjectHeaders(t *testing.T) {
	pool := pgtest.Require(t)
	ctx := context.Background()
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema, InjectHeaders: func(ctx context.Context, set func(k, v string)) {
		v, _ := ctx.Value(ctxKey{}).(string)
		set("traceparent", v)
		set("from-ctx", v)
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mine := map[string]string{"traceparent": "mine"}
	ev, err := pub.Enqueue(context.WithValue(ctx, ctxKey{}, "enqueue"), outbox.EventInput{Topic: "t", Payload: 1, Headers: mine})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := stored(t, schema, ev.ID.String()), map[string]string{"traceparent": "mine", "from-ctx": "enqueue"}; !maps.Equal(got, want) {
		t.Errorf("Enqueue stored %v, want %v", got, want)
	}
	if len(mine) != 1 {
		t.Errorf("the caller's map was written: %v", mine)
	}
	msg := outbox.NewMessage([]byte(`1`))
	msg.SetContext(context.WithValue(ctx, ctxKey{}, "publish"))
	evs, err := pub.PublishEvents(ctx, "t", msg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := stored(t, schema, evs[0].ID.String()), map[string]string{"traceparent": "publish", "from-ctx": "publish"}; !maps.Equal(got, want) {
		t.Errorf("Publish stored %v, want %v", got, want)
	}
	if len(msg.Metadata) != 0 {
		t.Errorf("the message's metadata was written: %v", msg.Metadata)
	}
}

// stored reads the headers column of event id.
func stored(t *testing.T, schema outbox.SchemaConfig, id string) map[string]string {
	t.Helper()
	var h map[string]string
	if err := pgtest.Require(t).QueryRow(context.Background(), fmt.Sprintf(`SELECT headers FROM %q WHERE id = $1`, schema.Table), id).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return h
}
