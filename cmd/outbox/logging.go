package main

import (
	"context"
	"io"
	"log/slog"
	"sort"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox"
)

// routerHandlerError is the message Watermill's Router logs at ERROR for every error a handler
// returns. The outbox Subscriber already logs each failed delivery once (WARN, or ERROR for a
// dead letter) with the event's id, topic, attempt and next attempt, so the command lowers the
// router's line to DEBUG. Library users get the same by giving the Router (or
// forwarder.New) a logger that does this; see newSlogLogger.
const routerHandlerError = "Handler returned error"

// quietInfo are the INFO messages of Watermill's Router (as each forwarder runs one), of the
// webhook publisher's Close and of the Subscriber's wake probe that the command logs at DEBUG:
// the relay's own start, wakeup, stop and stopped lines say the same once. Their WARN and ERROR
// lines keep their levels.
var quietInfo = map[string]bool{
	"Adding handler": true, "Running router handlers": true, "Starting handler": true,
	"Closing router": true, "Subscriber stopped": true, "Waiting for messages": true,
	"All messages processed": true, "Router closed": true, "Webhook publisher closed": true,
	"outbox: wake probe on: the relay claims within about one interval of any writer's commit (it probes the table's sequence; every idle interval after a second without writes)": true,
}

// slogLogger is the command's watermill.LoggerAdapter on log/slog, with a real WARN level
// (outbox.WarnLogger) and Watermill's trace level as slog level -8 ("TRACE"). Fields are
// written sorted by name. Safe for concurrent use.
type slogLogger struct{ l *slog.Logger }

var (
	_ watermill.LoggerAdapter = slogLogger{}
	_ outbox.WarnLogger       = slogLogger{}
)

// newSlogLogger returns the command's logger writing text lines (time=… level=… msg=… k=v…)
// to w at INFO, DEBUG with debug, TRACE with trace.
func newSlogLogger(w io.Writer, debug, trace bool) slogLogger {
	level := slog.LevelInfo
	switch {
	case trace:
		level = watermill.LevelTrace
	case debug:
		level = slog.LevelDebug
	}
	h := slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.LevelKey && a.Value.Any() == slog.Level(watermill.LevelTrace) {
			a.Value = slog.StringValue("TRACE")
		}
		return a
	}})
	return slogLogger{slog.New(h)}
}

func attrs(fields watermill.LogFields, err error) []any {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]any, 0, 2*len(keys)+2)
	for _, k := range keys {
		v := fields[k]
		if s, ok := v.(string); ok && s == `""` {
			v = "" // startFields' spelling of an empty value; slog quotes "" itself
		}
		out = append(out, k, v)
	}
	if err != nil {
		out = append(out, "error", err.Error())
	}
	return out
}

func (s slogLogger) log(level slog.Level, msg string, err error, fields watermill.LogFields) {
	if !s.l.Enabled(context.Background(), level) {
		return
	}
	s.l.Log(context.Background(), level, msg, attrs(fields, err)...)
}

// Error logs at ERROR, except the Router's duplicate "Handler returned error", at DEBUG.
func (s slogLogger) Error(msg string, err error, fields watermill.LogFields) {
	if msg == routerHandlerError {
		s.log(slog.LevelDebug, msg, err, fields)
		return
	}
	s.log(slog.LevelError, msg, err, fields)
}

// Warn logs at WARN (outbox.WarnLogger).
func (s slogLogger) Warn(msg string, err error, fields watermill.LogFields) {
	s.log(slog.LevelWarn, msg, err, fields)
}

// Info logs at INFO, except the lines of quietInfo, at DEBUG.
func (s slogLogger) Info(msg string, fields watermill.LogFields) {
	if quietInfo[msg] {
		s.log(slog.LevelDebug, msg, nil, fields)
		return
	}
	s.log(slog.LevelInfo, msg, nil, fields)
}
func (s slogLogger) Debug(msg string, fields watermill.LogFields) {
	s.log(slog.LevelDebug, msg, nil, fields)
}
func (s slogLogger) Trace(msg string, fields watermill.LogFields) {
	s.log(watermill.LevelTrace, msg, nil, fields)
}

func (s slogLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return slogLogger{s.l.With(attrs(fields, nil)...)}
}
