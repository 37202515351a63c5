package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox/forwarder/amqp"
	outboxasynq "github.com/watermill-outbox/outbox/forwarder/asynq"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
	"github.com/watermill-outbox/outbox/forwarder/redisstream"
	"github.com/watermill-outbox/outbox/webhook"
)

// destForms lists the accepted --to forms, for error messages.
const destForms = "kafka://host:9092[,host2:9092], amqp://user:password@host:5672/[vhost], redis://host:6379[/db], http(s)://host/path or " + asynqForm

// destKind is the broker behind a --to URL.
type destKind string

const (
	destKafka destKind = "Kafka"
	destAMQP  destKind = "RabbitMQ"
	destRedis destKind = "Redis Streams"
	destHTTP  destKind = "webhook"
	destAsynq destKind = "asynq"
)

// destURL is a parsed --to value.
type destURL struct {
	kind destKind
	// raw is the value as given; shown hides any password.
	raw, shown string
	// brokers are Kafka's bootstrap brokers.
	brokers []string
	// redis are the Redis client options.
	redis *redis.Options
	// asynq is the asynq task publisher's config (destAsynq).
	asynq *outboxasynq.Config
}

// parseDestURL parses a --to value. Errors name the accepted forms.
func parseDestURL(s string) (destURL, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return destURL{}, &usageError{fmt.Errorf("no destination given: pass --to URL or set OUTBOX_TO (accepted: %s)", destForms)}
	}
	u, err := url.Parse(s)
	if err != nil {
		return destURL{}, &usageError{fmt.Errorf("--to %q is not a URL (%s): use %s", redactDSN(s), urlErrText(err), destForms)}
	}
	d := destURL{raw: s, shown: u.Redacted()}
	switch strings.ToLower(u.Scheme) {
	case "kafka":
		for _, b := range strings.Split(u.Host, ",") {
			if b = strings.TrimSpace(b); b != "" {
				d.brokers = append(d.brokers, b)
			}
		}
		if len(d.brokers) == 0 {
			return d, &usageError{fmt.Errorf("--to %q names no Kafka broker: use kafka://host:9092[,host2:9092]", d.shown)}
		}
		d.kind = destKafka
	case "amqp", "amqps":
		if u.Host == "" {
			return d, &usageError{fmt.Errorf("--to %q names no RabbitMQ host: use amqp://user:password@host:5672/", d.shown)}
		}
		d.kind = destAMQP
	case "redis", "rediss":
		opts, err := redis.ParseURL(s)
		if err != nil {
			return d, &usageError{fmt.Errorf("--to %q is not a Redis URL (%v): use redis://[user:password@]host:6379[/db]", d.shown, err)}
		}
		d.redis, d.kind = opts, destRedis
	case "asynq+redis", "asynq+rediss":
		err := parseAsynqURL(&d, u)
		return d, err
	case "http", "https":
		if u.Host == "" {
			return d, &usageError{fmt.Errorf("--to %q names no host: use http(s)://host/path", d.shown)}
		}
		d.kind = destHTTP
	default:
		return d, &usageError{fmt.Errorf("--to %q is not supported: use %s", d.shown, destForms)}
	}
	return d, nil
}

// name is the destination's name in outages and metrics: "webhook <host>" (what the webhook
// publisher's errors name), else its kind.
func (d destURL) name() string {
	if d.kind == destHTTP {
		if u, err := url.Parse(d.raw); err == nil {
			return "webhook " + u.Host
		}
	}
	return string(d.kind)
}

// destOptions tune the destination's publisher.
type destOptions struct {
	// secret signs webhook requests (HMAC-SHA256, Outbox-Signature header); "" = unsigned.
	secret string
	// allow lists address ranges the webhook may reach although they are private or loopback.
	allow []netip.Prefix
	// exchange is the RabbitMQ exchange ("" = the default exchange, routing key = queue).
	exchange string
	// timeout bounds one webhook request (0 = the webhook default, 10s).
	timeout time.Duration
	// permanent lists the webhook answers that dead-letter an event at once
	// (webhook.Config.PermanentStatuses).
	permanent []int
	// probe makes a Redis (or asynq) destination answer PING first, failing when it does not
	// (the demo).
	// The relay starts without: a broker down at start is an outage (its events wait, no
	// attempt counted, /readyz says so) until it is up, as Kafka and RabbitMQ are.
	probe bool
}

// openPublisher builds the Watermill publisher of d. The caller closes it.
func openPublisher(ctx context.Context, d destURL, opts destOptions, logger watermill.LoggerAdapter) (message.Publisher, error) {
	switch d.kind {
	case destKafka:
		pub, err := kafka.NewPublisher(kafka.Config{Brokers: d.brokers}, logger)
		if err != nil {
			return nil, kafkaConnectError(d, err)
		}
		return pub, nil
	case destAMQP:
		pub, err := amqp.NewPublisher(amqp.Config{URL: d.raw, Exchange: opts.exchange}, logger)
		if err != nil {
			return nil, fmt.Errorf("cannot connect to RabbitMQ at %s (%s): check that it runs and that --to %s has the right user, password and vhost", hostOf(d.raw), oneLine(err.Error()), d.shown)
		}
		return pub, nil
	case destRedis:
		// go-redis logs dial failures on its own, several lines each: route them to the logger's
		// debug level (the error returned here or the relay's WARN lines say what failed).
		redis.SetLogger(redisLogger{logger})
		if opts.probe {
			po := *d.redis
			po.MaxRetries = -1
			probe := redis.NewClient(&po)
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := probe.Ping(pctx).Err()
			cancel()
			_ = probe.Close()
			if err != nil {
				return nil, fmt.Errorf("cannot connect to Redis at %s (%s): check that it runs and that --to %s is right", d.redis.Addr, oneLine(err.Error()), d.shown)
			}
		}
		opts := *d.redis
		return redisstream.NewPublisher(redisstream.Config{Options: &opts}, logger)
	case destAsynq:
		return openAsynq(d, opts.probe, logger)
	case destHTTP:
		pub, err := webhook.NewPublisher(webhook.Config{URL: d.raw, Secret: opts.secret, AllowedPrefixes: opts.allow, Timeout: opts.timeout, PermanentStatuses: opts.permanent}, logger)
		var ce *webhook.ConfigError
		if errors.As(err, &ce) && strings.HasPrefix(ce.Field, "PermanentStatuses") {
			return nil, fmt.Errorf("--webhook-permanent-status: %s", ce.Reason)
		}
		if errors.As(err, &ce) && strings.HasPrefix(ce.Field, "Secret") {
			msg := ce.Reason
			if ce.Err != nil {
				msg += ": " + strings.TrimPrefix(ce.Err.Error(), "webhook: ")
			}
			return nil, &usageError{fmt.Errorf("--secret: %s", oneLine(msg))}
		}
		if err != nil {
			return nil, fmt.Errorf("webhook --to %s: %s (a private or loopback receiver needs --allow-prefix, e.g. --allow-prefix 127.0.0.0/8)", d.shown, oneLine(err.Error()))
		}
		return pub, nil
	}
	return nil, fmt.Errorf("unknown destination %q", d.shown)
}

// kafkaConnectError is the one-line message of a failed connection to d's Kafka brokers, in
// the form of the RabbitMQ and Redis ones: the brokers as host:port[,host:port] and the --to URL.
func kafkaConnectError(d destURL, err error) error {
	return fmt.Errorf("cannot connect to Kafka at %s (%s): check that the brokers run and that --to %s is right", strings.Join(d.brokers, ","), oneLine(err.Error()), d.shown)
}

// hostOf is the host:port of a URL, or the URL itself when it does not parse.
func hostOf(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	return raw
}

// parsePrefixes parses --allow-prefix values: CIDR prefixes or single addresses.
func parsePrefixes(vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil {
			return nil, &usageError{fmt.Errorf("--allow-prefix %q is neither a CIDR prefix (127.0.0.0/8) nor an IP address", v)}
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// redisLogger routes go-redis's own log lines to a Watermill logger at debug level.
type redisLogger struct{ l watermill.LoggerAdapter }

// Printf implements go-redis's logging interface.
func (r redisLogger) Printf(_ context.Context, format string, v ...any) {
	r.l.Debug("redis: "+oneLine(fmt.Sprintf(format, v...)), nil)
}
