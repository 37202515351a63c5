package webhook_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	_ "github.com/watermill-outbox/outbox/sqlite"
	"github.com/watermill-outbox/outbox/webhook"
)

// Relay the outbox to an HTTP receiver: each event is POSTed with its payload unchanged, its
// id and topic in headers and an HMAC-SHA256 signature; the receiver checks the signature with
// VerifyMiddleware. The receiver here listens on 127.0.0.1, which the publisher's address guard
// refuses unless AllowedPrefixes lists it.
func ExampleNewPublisher() {
	ctx := context.Background()
	secret := "a-secret-of-at-least-16-bytes"

	got := make(chan string, 1)
	receiver, err := webhook.VerifyMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- r.Header.Get("Outbox-Topic") + " " + string(body)
	}), webhook.VerifyOptions{Keys: [][]byte{[]byte(secret)}}) // 401 unless the signature verifies
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(receiver)
	defer srv.Close()

	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	writer, _ := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	if err := writer.Publish("orders.created", outbox.NewMessage([]byte(`{"order":42}`))); err != nil {
		panic(err)
	}

	pub, err := webhook.NewPublisher(webhook.Config{
		URL:             srv.URL + "/orders",
		Secret:          secret,
		AllowedPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	sub, _ := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
	fwd, err := forwarder.New(sub, pub, forwarder.Config{}, nil)
	if err != nil {
		panic(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	fmt.Println(<-got)
	_ = fwd.Close()
	// Output:
	// orders.created {"order":42}
}

// A receiver that does not use VerifyMiddleware checks the Outbox-Signature header itself,
// over the body bytes exactly as received.
func ExampleVerify() {
	secret := []byte("a-secret-of-at-least-16-bytes")
	body := []byte(`{"order":42}`)
	header := webhook.Sign(secret, body) // what the publisher sends in Outbox-Signature

	fmt.Println(webhook.Verify(secret, body, header))
	fmt.Println(webhook.Verify(secret, []byte(`{"order":43}`), header))
	fmt.Println(webhook.Verify([]byte("another-secret-of-16-bytes"), body, header))
	// Output:
	// <nil>
	// webhook: signature mismatch
	// webhook: signature mismatch
}
