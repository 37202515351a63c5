package outbox

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/engine"
)

// eventOf returns the engine's conversion of a claimed row into the Event that emitted messages
// carry (EventFromContext), with the event id in canonical form.
func eventOf(s *schema) func(c *dialect.Claimed) (any, string) {
	return func(c *dialect.Claimed) (any, string) {
		ev := &Event{Sequence: c.Sequence, Topic: c.Topic, Payload: c.Payload, CreatedAt: c.CreatedAt, Attempts: c.Attempts,
			DeliveryStarts: c.DeliveryStarts, OrderingKey: deref(c.OrderingKey), LastError: deref(c.LastError)}
		ev.ID, _ = uuid.Parse(c.ID)
		switch c.Headers {
		case "{}":
			// No headers (the column's default): nothing to decode.
			ev.Headers = map[string]string{}
		case "null":
			// JSON null decodes to no map, as json.Unmarshal would.
		default:
			if err := json.Unmarshal([]byte(c.Headers), &ev.Headers); err != nil {
				ev.Headers = map[string]string{"outbox-headers-error": err.Error()}
			}
		}
		if len(c.Extra) > 0 {
			ev.Extra = make(map[string]any, len(c.Extra))
			for i, col := range s.cfg.ExtraColumns {
				ev.Extra[col.Name] = c.Extra[i]
			}
		}
		return ev, ev.ID.String()
	}
}

// newMessage builds the Watermill message of an event (eventOf's values): the payload, the
// stored headers and the outbox metadata, in a context that carries the event and the holder
// of its Nack's reason (SetNackError).
func newMessage(ctx context.Context, v any, id string) (*message.Message, engine.Answerer, context.CancelFunc) {
	ev := v.(*Event)
	msg := message.NewMessage(id, ev.Payload)
	for k, v := range ev.Headers {
		msg.Metadata[k] = v
	}
	msg.Metadata[MetadataEventID] = id
	msg.Metadata[MetadataTopic] = ev.Topic
	if ev.OrderingKey != "" {
		msg.Metadata[MetadataOrderingKey] = ev.OrderingKey
	}
	msg.Metadata[MetadataSequence] = strconv.FormatInt(ev.Sequence, 10)
	msg.Metadata[MetadataAttempt] = strconv.Itoa(ev.Attempts + max(ev.DeliveryStarts, 1))
	hold := &errHolder{}
	mctx, cancel := context.WithCancel(&eventContext{Context: ctx, ev: ev, hold: hold})
	msg.SetContext(mctx)
	return msg, hold, cancel
}

// engine returns the engine's settings of c (defaults applied).
func (c SubscriberConfig) engine() engine.Config {
	e := engine.Config{RelayName: c.RelayName, BatchSize: c.BatchSize, MaxRunPerKey: c.MaxRunPerKey, KeyScan: c.KeyScan,
		MaxAttempts: c.MaxAttempts, Concurrency: c.Concurrency, MaxDeliveryStarts: c.MaxDeliveryStarts,
		LeaseDuration: c.LeaseDuration, PollInterval: c.PollInterval, DeliveryTimeout: c.DeliveryTimeout,
		CloseTimeout: c.CloseTimeout, MarkInterval: c.MarkInterval, RetryBase: c.RetryBase, RetryMax: c.RetryMax,
		UnavailableBackoff: c.UnavailableBackoff, UnavailableBackoffMax: c.UnavailableBackoffMax,
		UnavailableDeadLetterAfter: c.UnavailableDeadLetterAfter, WakeProbeInterval: c.WakeProbeInterval,
		SweepInterval: sweepInterval, TakeBack: c.takeBack,
		SQLiteEager: dialect.SQLiteEager.Load(), SQLiteNoReadFirst: dialect.SQLiteNoReadFirst.Load()}
	if w := c.Wakeup; w != nil {
		e.Wakeup = w.Listen
	}
	e.Destination = c.Destination
	if limits := c.DestinationLimits; len(limits) > 0 {
		e.Limits = func(dest string) engine.Limit { return engine.Limit(limits[dest]) }
	}
	return e
}

// sweepInterval is how often subscriptions with floors sweep below them; 0 is the engine's
// default (a variable for the tests, export_test.go).
var sweepInterval time.Duration

// engine returns the engine's hooks of h: each calls h's hook of the same name.
func (h Hooks) engine() engine.Hooks {
	var e engine.Hooks
	if f := h.OnDelivered; f != nil {
		e.OnDelivered = func(i engine.DeliveredInfo) { f(DeliveredInfo(i)) }
	}
	if f := h.OnFailed; f != nil {
		e.OnFailed = func(i engine.FailedInfo) { f(FailedInfo(i)) }
	}
	if f := h.OnDeadLettered; f != nil {
		e.OnDeadLettered = func(i engine.FailedInfo) { f(FailedInfo(i)) }
	}
	if f := h.OnUnavailable; f != nil {
		e.OnUnavailable = func(i engine.FailedInfo) { f(FailedInfo(i)) }
	}
	if f := h.OnOutage; f != nil {
		e.OnOutage = func(i engine.OutageInfo) { f(OutageInfo(i)) }
	}
	if f := h.OnLeaseLost; f != nil {
		e.OnLeaseLost = func(i engine.LeaseLostInfo) { f(LeaseLostInfo(i)) }
	}
	if f := h.OnClaim; f != nil {
		e.OnClaim = func(i engine.ClaimInfo) { f(ClaimInfo(i)) }
	}
	if f := h.OnMark; f != nil {
		e.OnMark = func(i engine.MarkInfo) { f(MarkInfo(i)) }
	}
	if f := h.OnHeld; f != nil {
		e.OnHeld = func(i engine.HeldInfo) { f(HeldInfo(i)) }
	}
	return e
}
