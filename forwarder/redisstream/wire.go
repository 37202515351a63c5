package redisstream

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// entry is one marshaled message: its position in the batch, its stream and its fields as
// field, value pairs in field-name order.
type entry struct {
	i      int
	stream string
	fields []any
}

// entry marshals o (the i-th message of the batch) and checks its size.
func (p *Publisher) entry(i int, o forwarder.Outgoing) (*entry, error) {
	values, err := p.marshaller.Marshal(o.Topic, o.Message)
	if err != nil {
		return nil, fmt.Errorf("outbox redisstream: marshal: %w", err)
	}
	values[FieldTopic] = o.Topic
	if key := o.Message.Metadata.Get(outbox.MetadataOrderingKey); key != "" {
		values[FieldOrderingKey] = key
	}
	en := &entry{i: i, stream: p.cfg.Stream, fields: make([]any, 0, 2*len(values))}
	if en.stream == "" {
		en.stream = o.Topic
	}
	size := 0
	for _, name := range slices.Sorted(maps.Keys(values)) {
		v := values[name]
		size += len(name) + valueLen(v)
		en.fields = append(en.fields, name, v)
	}
	if size > p.maxEntry {
		return nil, fmt.Errorf("%w (%d > %d bytes)", ErrEntryTooLarge, size, p.maxEntry)
	}
	return en, nil
}

// valueLen is the length of v as go-redis sends it.
func valueLen(v any) int {
	switch v := v.(type) {
	case string:
		return len(v)
	case []byte:
		return len(v)
	default:
		return len(fmt.Sprint(v))
	}
}

// args is the XADD of en.
func (en *entry) args(maxLen int64) *redis.XAddArgs {
	return &redis.XAddArgs{Stream: en.stream, Values: en.fields, MaxLen: maxLen, Approx: maxLen > 0}
}

// runScript appends the entries of one ordering key in order and stops at the first XADD that
// fails. KEYS are the streams; ARGV[1] is MAXLEN (0: none), then per entry the stream's index
// in KEYS, the number of fields and the field, value pairs. It returns {added, failure, ids}:
// the number of entries appended, the error of the entry after them ("" when all were), and
// their ids.
const runScript = `
local maxlen = ARGV[1]
local ids = {}
local i = 2
while i <= #ARGV do
  local key = KEYS[tonumber(ARGV[i])]
  local last = i + 1 + 2 * tonumber(ARGV[i + 1])
  local r
  if maxlen ~= '0' then
    r = redis.pcall('XADD', key, 'MAXLEN', '~', maxlen, '*', unpack(ARGV, i + 2, last))
  else
    r = redis.pcall('XADD', key, '*', unpack(ARGV, i + 2, last))
  end
  if type(r) == 'table' and r.err then
    return {#ids, r.err, ids}
  end
  ids[#ids + 1] = r
  i = last + 1
end
return {#ids, '', ids}
`

// runArgs returns the KEYS and ARGV of runScript for entries.
func runArgs(entries []*entry, maxLen int64) ([]string, []any) {
	var keys []string
	index := map[string]int{}
	argv := []any{maxLen}
	for _, en := range entries {
		k, ok := index[en.stream]
		if !ok {
			keys = append(keys, en.stream)
			k = len(keys)
			index[en.stream] = k
		}
		argv = append(argv, k, len(en.fields)/2)
		argv = append(argv, en.fields...)
	}
	return keys, argv
}

// errScriptReply is the cause when runScript's reply does not have its shape.
var errScriptReply = errors.New("unexpected reply from the append script")

// runResult decodes runScript's reply.
func runResult(cmd *redis.Cmd) (added int, failure string, err error) {
	reply, err := cmd.Slice()
	if err != nil || len(reply) != 3 {
		return 0, "", fmt.Errorf("%w: %v", errScriptReply, reply)
	}
	n, ok1 := reply[0].(int64)
	failure, ok2 := reply[1].(string)
	if !ok1 || !ok2 {
		return 0, "", fmt.Errorf("%w: %v", errScriptReply, reply)
	}
	return int(n), failure, nil
}

// ServerError is an error reply of Redis to one XADD run by the append script (see
// Publisher.PublishBatch); an XADD sent on its own fails with go-redis's own redis.Error.
type ServerError struct {
	// Message is the reply, e.g. "WRONGTYPE Operation against a key holding the wrong kind of value".
	Message string
}

// Error returns the reply.
func (e *ServerError) Error() string { return e.Message }

// RedisError marks it as a Redis reply (the redis.Error interface).
func (e *ServerError) RedisError() {}

var _ redis.Error = (*ServerError)(nil)
