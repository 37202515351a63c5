package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// drainLimit bounds how much of an unread response body is discarded to let the connection be
// reused; a longer body closes the connection instead.
const drainLimit = 64 << 10

// Publisher is a Watermill message.Publisher that POSTs each message to an HTTP endpoint,
// signed, without following redirects, and only to addresses the built-in guard accepts.
//
// Publish is safe for concurrent use. Close is idempotent: it refuses new Publish calls,
// cancels requests in flight, waits for running Publish calls to return and closes idle
// connections.
type Publisher struct {
	cfg       Config
	keys      [][]byte     // Config.Secret or Config.Secrets, checked and decoded
	permanent map[int]bool // Config.PermanentStatuses
	fixedURL  *url.URL
	client    *http.Client
	logger    watermill.LoggerAdapter

	mu       sync.RWMutex
	closed   bool
	inFlight sync.WaitGroup
	closeCtx context.Context
	cancel   context.CancelFunc
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg (see Config.Validate; errors are *ConfigError) and returns a
// Publisher. A nil logger means watermill.NopLogger{}.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	cfg.setDefaults()
	fixed, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	keys, err := signingKeys(cfg.Scheme, "Secret", cfg.Secret, cfg.Secrets)
	if err != nil {
		return nil, err
	}
	cfg.Headers = maps.Clone(cfg.Headers)
	cfg.Secrets = slices.Clone(cfg.Secrets)
	cfg.AllowedPrefixes = append([]netip.Prefix(nil), cfg.AllowedPrefixes...)

	dialer := &guardedDialer{
		dialer: &net.Dialer{
			Timeout:   cfg.Timeout,
			KeepAlive: 30 * time.Second,
			Control:   guardControl(cfg.AllowedPrefixes),
		},
		lookup: cfg.LookupIP,
	}
	transport := &http.Transport{
		Proxy:                  cfg.Proxy,
		DialContext:            dialer.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    10,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	client := &http.Client{
		Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	closeCtx, cancel := context.WithCancel(context.Background())
	permanent := make(map[int]bool, len(cfg.PermanentStatuses))
	for _, code := range cfg.PermanentStatuses {
		permanent[code] = true
	}
	return &Publisher{
		cfg:       cfg,
		keys:      keys,
		permanent: permanent,
		fixedURL:  fixed,
		client:    client,
		logger:    logger.With(watermill.LogFields{"component": "webhook"}),
		closeCtx:  closeCtx,
		cancel:    cancel,
	}, nil
}

// Publish POSTs msgs to their target one after another, in order, and returns nil when every
// one was answered with a 2xx status. It stops at the first failure and returns a
// *DeliveryError naming that message (Index, EventID) — inside an *outbox.PermanentError when
// DeliveryError.Permanent, inside an *outbox.UnavailableError when DeliveryError.Unavailable
// (errors.As finds the *DeliveryError either way); earlier messages were delivered, later ones
// not attempted. Each request carries the payload bytes unchanged, Content-Type, the
// metadata as headers, HeaderEventID (msg.UUID), HeaderTopic (topic) and the signature; each
// attempt's context is msg.Context() bounded by Config.Timeout. After Close it returns
// ErrPublisherClosed. Safe for concurrent use.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return ErrPublisherClosed
	}
	p.inFlight.Add(1)
	p.mu.RUnlock()
	defer p.inFlight.Done()

	for i, msg := range msgs {
		if err := p.publishOne(topic, i, msg); err != nil {
			return err
		}
	}
	return nil
}

// Destination names the destination msg is bound for, as the outbox's
// SubscriberConfig.Destination wants it: "webhook <host>" of its target URL (host with its
// port when the URL has one), the name the publisher's unavailable errors carry; "" when the
// target cannot be resolved (Publish then fails it with the reason). With
// SubscriberConfig.Destination set to it, an outage of one receiver holds only the events
// bound for that host, and SubscriberConfig.DestinationLimits are keyed by that name. Safe for
// concurrent use.
func (p *Publisher) Destination(topic string, msg *message.Message) string {
	u, _, _, derr := p.resolveTarget(topic, msg)
	if derr != nil || u.Host == "" {
		return ""
	}
	return "webhook " + u.Host
}

// Close stops the publisher: later Publish calls return ErrPublisherClosed, requests in flight
// are cancelled (their messages fail), and Close returns once running Publish calls have
// returned. Calling it again does nothing and returns nil.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.inFlight.Wait()
	p.client.CloseIdleConnections()
	p.logger.Info("Webhook publisher closed", nil)
	return nil
}

func (p *Publisher) publishOne(topic string, index int, msg *message.Message) error {
	if msg == nil {
		return &DeliveryError{Index: index, Topic: topic, Permanent: true, Err: fmt.Errorf("webhook: message %d is nil", index)}
	}
	start := time.Now()
	res := Result{EventID: msg.UUID, Topic: topic, Attempt: p.cfg.Now()}

	ctx, cancel := context.WithTimeout(msg.Context(), p.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(p.closeCtx, cancel)
	defer stop()
	if p.closeCtx.Err() != nil {
		cancel() // AfterFunc on a done context cancels later, in a goroutine
	}

	derr := p.attempt(ctx, topic, msg, &res)
	res.Duration = time.Since(start)
	if derr != nil {
		derr.Index = index
		derr.EventID = msg.UUID
		derr.Topic = topic
		derr.URL = res.URL
		derr.StatusCode = res.StatusCode
		derr.Body = res.Body
		res.Err = TruncateForRecord(derr.Error())
	}
	fields := watermill.LogFields{"event_id": msg.UUID, "topic": topic, "url": res.URL, "status": res.StatusCode, "duration": res.Duration}
	if derr != nil {
		// Returned to the caller, which decides whether to log it; only traced here.
		p.logger.Debug("Webhook delivery failed", fields)
	} else {
		p.logger.Debug("Webhook delivered", fields)
	}
	if p.cfg.OnResult != nil {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(msg.Context()), p.cfg.Timeout)
		p.cfg.OnResult(rctx, res)
		rcancel()
	}
	if derr != nil {
		return classified(derr)
	}
	return nil
}

// attempt performs one delivery and fills res; it returns nil on a 2xx answer.
func (p *Publisher) attempt(ctx context.Context, topic string, msg *message.Message, res *Result) *DeliveryError {
	permanent := func(err error) *DeliveryError { return &DeliveryError{Permanent: true, Err: err} }

	if msg.UUID == "" {
		return permanent(ErrMissingEventID)
	}
	u, keys, targetHeaders, derr := p.resolveTarget(topic, msg)
	if derr != nil {
		return derr
	}
	res.URL = u.Redacted()
	if err := CheckURL(u, p.cfg.AllowedPrefixes); err != nil {
		return &DeliveryError{Err: err}
	}
	if p.cfg.URLGuard != nil {
		if err := p.cfg.URLGuard(ctx, u); err != nil {
			return &DeliveryError{Err: fmt.Errorf("%w: %w", ErrURLDenied, err)}
		}
	}

	h := http.Header{"User-Agent": {DefaultUserAgent}}
	if err := addHeaders(h, "config", p.cfg.Headers); err != nil {
		return permanent(err) // validated at construction; kept for safety
	}
	if err := addHeaders(h, "target", targetHeaders); err != nil {
		return permanent(err)
	}
	if err := addHeaders(h, "metadata", msg.Metadata); err != nil {
		return permanent(err)
	}
	if err := checkHeader("message", HeaderEventID, msg.UUID); err != nil {
		return permanent(err)
	}
	if err := checkHeader("topic", HeaderTopic, topic); err != nil {
		return permanent(err)
	}
	body := []byte(msg.Payload)
	h.Set("Content-Type", p.cfg.ContentType)
	h.Set(HeaderEventID, msg.UUID)
	h.Set(HeaderTopic, topic)
	if derr := p.sign(h, keys, msg.UUID, body); derr != nil {
		return derr
	}

	// connected is set once the request has a connection (GotConn): before that nothing of it
	// has been sent.
	var connected atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return permanent(fmt.Errorf("webhook: build request: %w", err))
	}
	req.Header = h
	resp, err := p.client.Do(req)
	if err != nil {
		// No connection was obtained (lookup, dial or TLS handshake failed or timed out; net/http
		// returns the bare context error when the deadline ends a dial): nothing of the request
		// was sent, so the receiver could not be reached. A guard refusal or a cancellation
		// (Close, the caller) is not the receiver's doing.
		notConnected := !connected.Load() && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrURLDenied)
		return &DeliveryError{Unavailable: unreachable(err) || notConnected, Err: err}
	}
	defer resp.Body.Close()
	res.StatusCode = resp.StatusCode
	kept, readErr := io.ReadAll(io.LimitReader(resp.Body, p.cfg.MaxResponseBodyBytes))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	res.Body = TruncateForRecord(string(kept))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		derr := &DeliveryError{Err: ErrUnexpectedStatus, Permanent: p.permanent[resp.StatusCode]}
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			derr.Location = TruncateForRecord(resp.Header.Get("Location"))
		}
		if unavailableStatus(resp.StatusCode) {
			derr.Unavailable = true
			derr.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), p.cfg.Now())
		}
		return derr
	}
	if readErr != nil {
		// A 2xx answer counts as delivered even if its body could not be read in full.
		p.logger.Debug("Webhook response body read failed", watermill.LogFields{"event_id": msg.UUID, "error": readErr.Error()})
	}
	return nil
}

// resolveTarget returns the destination URL, signing keys and target headers of msg.
func (p *Publisher) resolveTarget(topic string, msg *message.Message) (*url.URL, [][]byte, map[string]string, *DeliveryError) {
	if p.cfg.Target == nil {
		return p.fixedURL, p.keys, nil, nil
	}
	t, err := p.cfg.Target(topic, msg)
	if err != nil {
		return nil, nil, nil, &DeliveryError{Err: fmt.Errorf("webhook: target: %w", err)}
	}
	own := t.Secret != "" || len(t.Secrets) > 0
	if own && len(p.keys) > 0 {
		return nil, nil, nil, &DeliveryError{Permanent: true, Err: &ConfigError{
			Field: "Target.Secret", Reason: "Config.Secret is set too", Err: ErrSecretConflict,
		}}
	}
	u, err := parseTargetURL(t.URL)
	if err != nil {
		return nil, nil, nil, &DeliveryError{Permanent: true, Err: &ConfigError{Field: "Target.URL", Reason: "invalid URL", Err: err}}
	}
	if !own {
		return u, p.keys, t.Headers, nil
	}
	keys, err := signingKeys(p.cfg.Scheme, "Target.Secret", t.Secret, t.Secrets)
	if err != nil {
		return nil, nil, nil, &DeliveryError{Permanent: true, Err: err}
	}
	return u, keys, t.Headers, nil
}

// sign adds the signature headers of the configured scheme: one signature per key (Standard
// Webhooks), none for the seed scheme without a key.
func (p *Publisher) sign(h http.Header, keys [][]byte, id string, body []byte) *DeliveryError {
	if p.cfg.Scheme == SchemeStandardWebhooks {
		if len(keys) == 0 {
			return &DeliveryError{Permanent: true, Err: &ConfigError{Field: "Secret", Reason: "Standard Webhooks needs a secret", Err: ErrInvalidSecret}}
		}
		ts := strconv.FormatInt(p.cfg.Now().Unix(), 10)
		sigs := make([]string, len(keys))
		for i, k := range keys {
			sigs[i] = "v1," + base64.StdEncoding.EncodeToString(standardMAC(k, id, ts, body))
		}
		h.Set(HeaderWebhookID, id)
		h.Set(HeaderWebhookTimestamp, ts)
		h.Set(HeaderWebhookSignature, strings.Join(sigs, " "))
		return nil
	}
	if len(keys) == 0 {
		return nil
	}
	h.Set(p.cfg.SignatureHeader, Sign(keys[0], body))
	return nil
}
