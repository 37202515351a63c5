package doctor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-outbox/outbox/webhook"
)

// destTimeout bounds each destination check's network calls.
const destTimeout = 5 * time.Second

// Kafka checks that the brokers answer and grant an idempotent producer id (InitProducerID,
// which an ACL without IDEMPOTENT_WRITE or a broker older than 0.11 refuses). The relay's
// producer (forwarder/kafka) always runs with acks=all and idempotent writes: its
// NewPublisher refuses options that weaken them, so there is no setting of the relay's to
// check beyond that.
func Kafka(ctx context.Context, brokers []string) Check {
	const name = "kafka"
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DialTimeout(destTimeout), kgo.RequestRetries(0), kgo.RetryTimeout(destTimeout))
	if err != nil {
		return failed(name, "Kafka client: "+oneLine(err.Error()), "check the broker addresses.")
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, destTimeout)
	defer cancel()
	where := strings.Join(brokers, ",")
	if err := cl.Ping(cctx); err != nil {
		return failed(name, fmt.Sprintf("no Kafka broker at %s answers: %s", where, oneLine(err.Error())),
			"check that the brokers run and that the URL names them (the relay waits for them without counting attempts, but delivers nothing).")
	}
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionTimeoutMillis = 60000
	resp, err := req.RequestWith(cctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return failed(name, fmt.Sprintf("Kafka at %s refuses an idempotent producer id: %s", where, oneLine(err.Error())),
			"grant the relay's principal IDEMPOTENT_WRITE on the cluster (Kafka < 3.0), or upgrade brokers older than 0.11; the relay's producer needs idempotence to keep each key's order through retries.")
	}
	return ok(name, fmt.Sprintf("brokers at %s answer and grant an idempotent producer id; the relay produces with acks=all and idempotent writes (forwarder/kafka refuses weaker settings)", where))
}

// RabbitMQ checks that the broker accepts the relay's connection with publisher confirms on
// a channel, that exchange exists (passive declare; "" = the default exchange), and that each
// of queues exists (passive declare): through the default exchange the routing key (the
// event's topic, or the fixed destination topic) must name an existing queue, or the relay's
// mandatory publishes come back unroutable. It returns the "rabbitmq" check and, when queues
// is not empty, "rabbitmq-queues"; with no queue to check, that one is Skipped.
func RabbitMQ(ctx context.Context, rawURL, exchange string, queues []string) []Check {
	const name, qname = "rabbitmq", "rabbitmq-queues"
	host := rawURL
	if u, err := url.Parse(rawURL); err == nil {
		host = u.Host
	}
	conn, err := amqp091.DialConfig(rawURL, amqp091.Config{Dial: amqp091.DefaultDial(destTimeout)})
	if err != nil {
		return []Check{failed(name, fmt.Sprintf("cannot connect to RabbitMQ at %s: %s", host, oneLine(err.Error())), "check that it runs and that the URL has the right user, password and vhost."),
			skipped(qname, "RabbitMQ unreachable")}
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		return []Check{failed(name, "the broker refuses publisher confirms on a channel: "+oneLine(err.Error()),
			"use RabbitMQ (or a broker) that supports publisher confirms: the relay marks an event delivered only once the broker confirmed it."), skipped(qname, "no confirm channel")}
	}
	_ = ch.Close()
	first := ok(name, fmt.Sprintf("RabbitMQ at %s accepts a channel in confirm mode (the relay publishes persistent messages with confirms and mandatory routing)", host))
	if exchange != "" {
		ch, err := conn.Channel()
		if err == nil {
			err = ch.ExchangeDeclarePassive(exchange, "direct", true, false, false, false, nil)
			if err == nil {
				_ = ch.Close()
			}
		}
		if err != nil {
			return []Check{failed(name, fmt.Sprintf("exchange %q: %s", exchange, oneLine(err.Error())), "declare the exchange (and bind its queues) before starting the relay; the relay publishes through an existing exchange."),
				skipped(qname, "the exchange is missing")}
		}
		first.Detail += fmt.Sprintf("; exchange %q exists", exchange)
	}
	if len(queues) == 0 {
		why := "no queue to check: pass the queues the relay's routing keys lead to (--amqp-queue)"
		if exchange != "" {
			why = fmt.Sprintf("no queue to check: which queues exchange %q routes to depends on its bindings (pass --amqp-queue to check some)", exchange)
		}
		return []Check{first, skipped(qname, why)}
	}
	var missing, present []string
	for _, q := range queues {
		ch, err := conn.Channel()
		if err != nil {
			return []Check{first, failed(qname, "opening a channel: "+oneLine(err.Error()), "check the broker's channel_max.")}
		}
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
		var ae *amqp091.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp091.NotFound:
			missing = append(missing, q) // the broker closed the channel
		case err != nil:
			return []Check{first, failed(qname, fmt.Sprintf("queue %q: %s", q, oneLine(err.Error())), "check the user's permissions on the vhost.")}
		default:
			present = append(present, q)
			_ = ch.Close()
		}
	}
	if len(missing) > 0 {
		return []Check{first, failed(qname, fmt.Sprintf("queue(s) %s do not exist: the relay's messages routed to them come back unroutable and are retried, then dead-lettered", quoteList(missing)),
			"declare the queues (durable) and their bindings before relaying, or route the topics elsewhere (--dest-topic, --amqp-exchange).")}
	}
	return []Check{first, ok(qname, "queue(s) "+quoteList(present)+" exist")}
}

// quoteList is s quoted and comma-separated.
func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

// Redis checks that Redis answers and that its maxmemory-policy is noeviction: under any other
// policy Redis deletes keys when it reaches maxmemory, streams (Redis Streams destination)
// and asynq's task keys included — delivered events silently lost. It reads INFO (which
// managed Redis services allow where CONFIG GET is refused). what names the destination
// ("Redis Streams", "asynq").
func Redis(ctx context.Context, opts *redis.Options, what string) Check {
	const name = "redis-eviction"
	o := *opts
	o.MaxRetries = -1
	o.DialTimeout = destTimeout
	c := redis.NewClient(&o)
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, destTimeout)
	defer cancel()
	info, err := c.Info(cctx, "memory").Result()
	if err != nil {
		return failed(name, fmt.Sprintf("Redis at %s: %s", o.Addr, oneLine(err.Error())), "check that it runs and that the URL is right.")
	}
	fields := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if k, v, found := strings.Cut(strings.TrimSpace(sc.Text()), ":"); found {
			fields[k] = v
		}
	}
	policy, limit := fields["maxmemory_policy"], fields["maxmemory_human"]
	if limit == "" || fields["maxmemory"] == "0" {
		limit = "none"
	}
	if policy == "" {
		return warned(name, fmt.Sprintf("Redis at %s does not report maxmemory_policy in INFO memory", o.Addr), "check by hand that maxmemory-policy is noeviction.")
	}
	if policy != "noeviction" {
		return failed(name, fmt.Sprintf("Redis at %s has maxmemory-policy %s (maxmemory %s): when it fills up it evicts keys, %s data included, so delivered events can vanish", o.Addr, policy, limit, what),
			"CONFIG SET maxmemory-policy noeviction (and set it in redis.conf, or in your provider's parameter group); when Redis is full, writes then fail and the relay retries them.")
	}
	return ok(name, fmt.Sprintf("Redis at %s: maxmemory-policy noeviction (maxmemory %s)", o.Addr, limit))
}

// Webhook checks that the webhook's URL passes the relay's address guard (webhook.CheckURL,
// and webhook.CheckIP for every address its host resolves to, as the guard does at dial time)
// with allow as the allowed prefixes, and that its address accepts a TCP connection (no
// request is sent).
func Webhook(ctx context.Context, rawURL string, allow []netip.Prefix) Check {
	const name = "webhook-guard"
	const fix = "point the webhook at a public address, or allow its network explicitly (webhook.Config.AllowedPrefixes, `--allow-prefix CIDR`) if the receiver is yours."
	u, err := url.Parse(rawURL)
	if err != nil {
		return failed(name, "the URL does not parse: "+oneLine(err.Error()), "give an http(s)://host/path URL.")
	}
	if err := webhook.CheckURL(u, allow); err != nil {
		return failed(name, fmt.Sprintf("%s is refused by the address guard: %s", u.Redacted(), oneLine(err.Error())), fix)
	}
	cctx, cancel := context.WithTimeout(ctx, destTimeout)
	defer cancel()
	host := u.Hostname()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = net.DefaultResolver.LookupNetIP(cctx, "ip", host); err != nil {
		return failed(name, fmt.Sprintf("host %q does not resolve: %s", host, oneLine(err.Error())), "check the host name (and the resolver of the relay's host).")
	}
	for _, a := range addrs {
		if err := webhook.CheckIP(a, allow); err != nil {
			return failed(name, fmt.Sprintf("%s resolves to %s, which the address guard refuses: %s", host, a, oneLine(err.Error())), fix)
		}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	var d net.Dialer
	conn, err := d.DialContext(cctx, "tcp", net.JoinHostPort(addrs[0].String(), port))
	if err != nil {
		return warned(name, fmt.Sprintf("%s passes the address guard, but %s:%s does not accept connections: %s", u.Redacted(), addrs[0], port, oneLine(err.Error())),
			"start the receiver; until it answers, the relay treats it as unavailable (no attempt counted).")
	}
	_ = conn.Close()
	return ok(name, fmt.Sprintf("%s passes the address guard (%d address(es)) and accepts connections", u.Redacted(), len(addrs)))
}
