// Package webhook delivers Watermill messages as signed HTTP POST requests, and helps
// receivers verify them.
//
// Publisher is a message.Publisher, so the outbox relay (forwarder) can use it as a
// destination. For each message it POSTs the payload bytes unchanged, with the metadata as
// headers, the event id (Outbox-Event-Id, = msg.UUID) and topic (Outbox-Topic), and a
// signature: either the seed scheme ("Outbox-Signature: sha256=<hex HMAC-SHA256 of the body>",
// RFC 2104) or the Standard Webhooks scheme (webhook-id, webhook-timestamp, webhook-signature).
// Only a 2xx answer counts as delivered; redirects are never followed; each attempt has a
// timeout (default 10s). A failure is returned as a *DeliveryError, which the relay turns into
// a Nack, classed for the outbox: a receiver that cannot be reached (refused, DNS, connect
// timeout, TLS handshake: any failure before a connection was made) or answers 429, 502, 503
// or 504 is unavailable (*outbox.UnavailableError, with the
// answer's Retry-After): the relay counts no attempt and pauses; a message that cannot be sent
// as it is, or an answer whose status Config.PermanentStatuses lists, is permanent
// (*outbox.PermanentError): dead-lettered at once; anything else is retried with backoff and
// dead-lettered at MaxAttempts. The relay pauses by destination name ("webhook <host>") and
// the topics whose events produced the error: with Config.Target spreading one topic over many
// hosts, one host's outage pauses that topic for all of them.
//
// The publisher cannot be turned against the internal network: before every request the URL
// is checked (CheckURL, and Config.URLGuard if set), and at connect time — after DNS
// resolution, so DNS rebinding cannot pass — the socket's address is checked by CheckIP, which
// refuses loopback, private, link-local, unique-local, CGNAT, multicast, reserved and cloud
// metadata addresses unless Config.AllowedPrefixes lists them. Environment proxies are not
// used unless Config.Proxy says so.
//
// Sending:
//
//	pub, err := webhook.NewPublisher(webhook.Config{
//		URL:    "https://hooks.example.com/orders",
//		Secret: os.Getenv("WEBHOOK_SECRET"),
//	}, logger)
//	if err != nil {
//		return err // *webhook.ConfigError
//	}
//	defer pub.Close()
//	err = pub.Publish("orders.created", message.NewMessage(id, []byte(`{"order":42}`)))
//	var derr *webhook.DeliveryError
//	if errors.As(err, &derr) {
//		log.Printf("status %d: %s", derr.StatusCode, derr.Body)
//	}
//
// Receiving:
//
//	h, err := webhook.VerifyMiddleware(ordersHandler, webhook.VerifyOptions{
//		Keys: [][]byte{[]byte(os.Getenv("WEBHOOK_SECRET"))}, // old and new during a rotation
//	})
//	if err != nil {
//		return err
//	}
//	http.Handle("/orders", h) // 401 unless the signature verifies
//
// Secrets: a Standard Webhooks secret is "whsec_" followed by the standard base64 of 24 to 64
// random bytes (the spec's range; DecodeSecret), a seed-scheme secret at least
// MinSeedSecretBytes (16) bytes; anything else is a *ConfigError. To rotate a Standard Webhooks
// secret, give the sender both (Config.Secrets: one "v1,<sig>" entry per secret in
// webhook-signature), move receivers to the new one (a receiver holding either key verifies),
// then drop the old one. The seed scheme carries one signature: list both keys at the
// receivers (VerifyOptions.Keys) before switching the sender's Secret.
//
// Receivers must drop repeats by event id: delivery is at least once.
package webhook
