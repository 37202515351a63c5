package main

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	outboxasynq "github.com/watermill-outbox/outbox/forwarder/asynq"
)

// asynqForm is the accepted asynq --to form.
const asynqForm = "asynq+redis://[user:password@]host:6379[/db][?queue=NAME&retention=24h&max-retry=N]"

// asynqDefaultTopics is what relay --to asynq+redis://… relays when --topics is not given: the
// task topics only (any other topic would be dead-lettered as not a task).
var asynqDefaultTopics = []string{outboxasynq.DefaultTopicPrefix + "*"}

// parseAsynqURL parses an asynq+redis:// or asynq+rediss:// --to value into d: the Redis
// options (go-redis's URL form) and the asynq settings of the query (queue, retention,
// max-retry), which are removed before go-redis reads the rest.
func parseAsynqURL(d *destURL, u *url.URL) error {
	q := u.Query()
	cfg := outboxasynq.Config{Queue: q.Get("queue")}
	if v := q.Get("retention"); v != "" {
		r, err := time.ParseDuration(v)
		if err != nil {
			return &usageError{fmt.Errorf("--to %q: retention=%q is not a Go duration such as 24h", d.shown, v)}
		}
		cfg.Retention = r
	}
	if v := q.Get("max-retry"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return &usageError{fmt.Errorf("--to %q: max-retry=%q is not a number", d.shown, v)}
		}
		cfg.MaxRetry = n
		if n == 0 {
			cfg.Options = []asynq.Option{asynq.MaxRetry(0)}
		}
	}
	for _, k := range []string{"queue", "retention", "max-retry"} {
		q.Del(k)
	}
	ru := *u
	ru.Scheme = strings.TrimPrefix(strings.ToLower(u.Scheme), "asynq+")
	ru.RawQuery = q.Encode()
	opts, err := redis.ParseURL(ru.String())
	if err != nil {
		return &usageError{fmt.Errorf("--to %q is not an asynq Redis URL (%v): use %s", d.shown, err, asynqForm)}
	}
	cfg.Redis = asynq.RedisClientOpt{Network: opts.Network, Addr: opts.Addr, Username: opts.Username, Password: opts.Password, DB: opts.DB,
		DialTimeout: opts.DialTimeout, ReadTimeout: opts.ReadTimeout, WriteTimeout: opts.WriteTimeout, PoolSize: opts.PoolSize, TLSConfig: opts.TLSConfig}
	if err := cfg.Validate(); err != nil {
		return &usageError{fmt.Errorf("--to %q: %v", d.shown, err)}
	}
	d.redis, d.asynq, d.kind = opts, &cfg, destAsynq
	return nil
}

// openAsynq returns the asynq task publisher of d; with probe it first checks that Redis
// answers (the relay does not: Redis down at start is an outage, see destOptions.probe).
func openAsynq(d destURL, probe bool, logger watermill.LoggerAdapter) (message.Publisher, error) {
	redis.SetLogger(redisLogger{logger})
	if probe {
		c := asynq.NewClient(d.asynq.Redis)
		err := c.Ping()
		_ = c.Close()
		if err != nil {
			return nil, fmt.Errorf("cannot connect to Redis at %s for asynq (%s): check that it runs and that --to %s is right", d.redis.Addr, oneLine(err.Error()), d.shown)
		}
	}
	return outboxasynq.NewPublisher(*d.asynq, logger)
}
