package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// Metadata keys of replayed events (see Subscriber.Replay). Like the other outbox-* keys they
// are reserved: a Publisher drops them from the headers it stores, so only a replay sets them.
const (
	// MetadataReplayOf is the id of the original event a replayed event copies (for a replay
	// of a replay, still the first original's id).
	MetadataReplayOf = "outbox-replay-of"
	// MetadataReplayID is the id of the Replay call that wrote the copy (one UUIDv7 per call,
	// ReplayResult.ReplayID).
	MetadataReplayID = "outbox-replay-id"
)

// DefaultReplayBatch is ReplayOptions.BatchSize's default: how many copies one insert writes
// (one transaction each).
const DefaultReplayBatch = 1000

// MaxReplayBatch is the largest ReplayOptions.BatchSize: a batch takes a per-key write lock
// for each of its distinct ordering keys (see PublisherConfig.MaxOrderingKeysPerCall).
const MaxReplayBatch = DefaultMaxOrderingKeysPerCall

// MaxReplayEvents is the most events one Replay copies: the selection's sequences are held in
// memory (8 bytes each) to be copied in sequence order. Split a larger window.
const MaxReplayEvents = 1_000_000

// replayScanPage is how many selected events one statement of the selection scan returns.
const replayScanPage = 10000

// ErrReplayTooLarge is returned by Replay when the filter selects more than MaxReplayEvents
// events; nothing is written. Narrow the window (or split it).
var ErrReplayTooLarge = errors.New("outbox: replay selects too many events")

// ReplayCountError is returned by Replay when ReplayOptions.Expect is set and the selection
// does not hold exactly that many events (events were cleaned up, or published into an open
// window, since the count was shown); nothing is written.
type ReplayCountError struct {
	Expected, Found int64
}

func (e *ReplayCountError) Error() string {
	return fmt.Sprintf("outbox: replay selects %d events, not the %d expected: nothing was replayed; count again", e.Found, e.Expected)
}

// ReplayFilter selects published events for Subscriber.Replay: those published (published_at)
// at or after Since and before Until, whose topic matches any of Topics (none: every topic)
// and, when Keys are given, whose ordering key is one of them. All conditions must hold.
//
// A destination is not stored with an event: the relay's configuration (a forwarder, a topic
// router) maps topics to destinations. To replay what went to one destination, give the topic
// patterns routed to it.
type ReplayFilter struct {
	// Since is the start of the window (inclusive), on the published_at column. Required.
	Since time.Time
	// Until is the end of the window (exclusive). Zero means the moment Replay is called
	// (this process's clock; ReplayResult.Until says which): pass the same Until to a dry run
	// and to the replay so that both select the same events. It must be after Since.
	Until time.Time
	// Topics are patterns as in Subscribe: exact, "prefix*", or "*".
	Topics []string
	// Keys are ordering keys (each 1..255 characters); at most MaxBatchSize of them. With
	// Keys, unordered events are not selected.
	Keys []string
}

// ReplayOptions says how Replay acts on its selection. The zero value replays with the
// defaults.
type ReplayOptions struct {
	// DryRun only counts the selected events (ReplayResult.Selected); nothing is written.
	DryRun bool
	// BatchSize is how many copies one insert writes, 1..MaxReplayBatch; 0 means
	// DefaultReplayBatch.
	BatchSize int
	// Expect, when above zero, is the count the caller showed (a dry run's Selected): when
	// the selection holds another number of events, Replay writes nothing and returns a
	// *ReplayCountError. Negative is a *ConfigError.
	Expect int64
}

// ReplayResult is what Replay selected and wrote.
type ReplayResult struct {
	// ReplayID identifies this replay: every copy carries it in MetadataReplayID. Zero for a
	// dry run.
	ReplayID uuid.UUID
	// Until is the window's end the selection used (ReplayFilter.Until, or the time Replay
	// resolved a zero Until to), truncated to microseconds like Since.
	Until time.Time
	// Selected is how many published events the filter selects.
	Selected int64
	// Replayed is how many copies were written (committed): Selected after a full replay,
	// fewer when an error stopped it (the copies written stay and are delivered).
	Replayed int64
}

// Validate checks f as Replay does before any SQL (a zero Until is taken as now): a
// *ConfigError naming the field, or nil.
func (f ReplayFilter) Validate() error {
	_, err := f.dialect()
	return err
}

// dialect checks f and returns it in the dialect's terms, with a zero Until resolved to now.
func (f ReplayFilter) dialect() (dialect.ReplayFilter, error) {
	if f.Since.IsZero() {
		return dialect.ReplayFilter{}, &ConfigError{Field: "ReplayFilter.Since", Reason: "required: the start of the published_at window"}
	}
	since, until := f.Since.Truncate(time.Microsecond), f.Until.Truncate(time.Microsecond)
	if f.Until.IsZero() {
		until = time.Now().Truncate(time.Microsecond)
	}
	if !until.After(since) {
		return dialect.ReplayFilter{}, &ConfigError{Field: "ReplayFilter.Until", Reason: fmt.Sprintf("%s is not after Since %s", until.Format(time.RFC3339Nano), since.Format(time.RFC3339Nano))}
	}
	out := dialect.ReplayFilter{Since: since, Until: until}
	for i, p := range f.Topics {
		tf, err := parseTopicPattern(fmt.Sprintf("ReplayFilter.Topics[%d]", i), p)
		if err != nil {
			return dialect.ReplayFilter{}, err
		}
		out.Topics = append(out.Topics, tf.dialect())
	}
	if len(f.Keys) > MaxBatchSize {
		return dialect.ReplayFilter{}, &ConfigError{Field: "ReplayFilter.Keys", Reason: fmt.Sprintf("%d keys: at most %d", len(f.Keys), MaxBatchSize)}
	}
	for i, k := range f.Keys {
		if k == "" || len(k) > 255 {
			return dialect.ReplayFilter{}, &ConfigError{Field: fmt.Sprintf("ReplayFilter.Keys[%d]", i), Reason: fmt.Sprintf("ordering key of %d bytes: give 1..255", len(k))}
		}
	}
	out.Keys = slices.Clone(f.Keys)
	return out, nil
}

// Validate checks o as Replay does before any SQL: a *ConfigError naming the field, or nil.
func (o ReplayOptions) Validate() error {
	if o.BatchSize < 0 || o.BatchSize > MaxReplayBatch {
		return &ConfigError{Field: "ReplayOptions.BatchSize", Reason: fmt.Sprintf("%d outside 1..%d (0: %d)", o.BatchSize, MaxReplayBatch, DefaultReplayBatch)}
	}
	if o.Expect < 0 {
		return &ConfigError{Field: "ReplayOptions.Expect", Reason: "must not be negative"}
	}
	return nil
}

// Replay re-sends published events: it writes a copy of each event f selects as a new event
// (a new id and sequence; topic, payload, headers, ordering key and extra columns copied; no
// idempotency key), which the relays deliver like any new event. The original rows are not
// changed: their delivery stays recorded, and each copy records its own delivery (attempts,
// published_at, dead letter). A copy's headers add MetadataReplayOf (the original's id) and
// MetadataReplayID (ReplayResult.ReplayID); receivers that dedupe by event id see a new id,
// and tell a replay by those headers (see docs/operating.md, "Replaying published events").
//
// Order: the copies are written in the originals' sequence order, so the copies of one
// ordering key are delivered in the originals' order, after every event of the key written
// before them (pending ones included: a key held behind a failed head holds its copies too).
// Copies are written in batches of o.BatchSize, each batch one transaction taking the same
// per-key write locks as a Publisher: an event of the key written by another writer while
// the replay runs may come between two batches' copies, never inside a batch.
//
// Steps: one count over the published_at index (with o.DryRun it returns here: Selected is
// the count); then the selection's sequences are read in pages of 10,000 through the same
// index, bounded above by the highest sequence counted (so the copies, written later, are
// never selected again); then each batch of originals is read by primary key and copied.
// The selection may hold at most MaxReplayEvents events (ErrReplayTooLarge, before anything
// is written).
//
// Errors (ctx's included): a *ConfigError for a bad filter or options (before any SQL),
// ErrReplayTooLarge, a *ReplayCountError (see ReplayOptions.Expect), or the database error;
// after an error, ReplayResult.Replayed says how many copies were written. Safe for
// concurrent use, also after Close; relays may run throughout.
func (s *Subscriber) Replay(ctx context.Context, f ReplayFilter, o ReplayOptions) (ReplayResult, error) {
	df, err := f.dialect()
	if err != nil {
		return ReplayResult{}, err
	}
	if err := o.Validate(); err != nil {
		return ReplayResult{}, err
	}
	res := ReplayResult{Until: df.Until}
	n, top, err := s.s.d.CountReplay(ctx, s.db, s.s.t, df)
	if err != nil {
		return res, fmt.Errorf("outbox: count events to replay in %s: %w", s.s.table, err)
	}
	res.Selected = n
	if o.DryRun {
		return res, nil
	}
	if o.Expect > 0 && n != o.Expect {
		return res, &ReplayCountError{Expected: o.Expect, Found: n}
	}
	if n > MaxReplayEvents {
		return res, fmt.Errorf("%w: %d events (at most %d): narrow the window", ErrReplayTooLarge, n, MaxReplayEvents)
	}
	if n == 0 {
		return res, nil
	}
	df.MaxSeq = top
	seqs := make([]int64, 0, n)
	var cur dialect.ReplayMark
	for {
		page, err := s.s.d.ScanReplay(ctx, s.db, s.s.t, df, cur, replayScanPage)
		if err != nil {
			return res, fmt.Errorf("outbox: select events to replay in %s: %w", s.s.table, err)
		}
		for _, m := range page {
			seqs = append(seqs, m.Sequence)
		}
		if len(page) < replayScanPage {
			break
		}
		cur = page[len(page)-1]
		if len(seqs) > MaxReplayEvents {
			break
		}
	}
	res.Selected = int64(len(seqs))
	if o.Expect > 0 && res.Selected != o.Expect {
		return res, &ReplayCountError{Expected: o.Expect, Found: res.Selected}
	}
	if res.Selected > MaxReplayEvents {
		return res, fmt.Errorf("%w: %d events (at most %d): narrow the window", ErrReplayTooLarge, res.Selected, MaxReplayEvents)
	}
	slices.Sort(seqs)
	res.ReplayID, err = uuid.NewV7()
	if err != nil {
		return res, fmt.Errorf("outbox: replay id: %w", err)
	}
	batch := o.BatchSize
	if batch == 0 {
		batch = DefaultReplayBatch
	}
	var extra []string
	for _, c := range s.s.t.Extra {
		extra = append(extra, c.Name)
	}
	slices.Sort(extra)
	start := time.Now()
	for i := 0; i < len(seqs); i += batch {
		chunk := seqs[i:min(i+batch, len(seqs))]
		rows, err := s.s.d.ReadReplay(ctx, s.db, s.s.t, chunk)
		if err != nil {
			return res, fmt.Errorf("outbox: read events to replay in %s: %w", s.s.table, err)
		}
		if len(rows) == 0 {
			continue // cleaned up meanwhile
		}
		in := &dialect.InsertParams{Table: s.s.t, Rows: make([]dialect.InsertRow, len(rows)), ExtraNames: extra, NoReturn: true}
		for j, r := range rows {
			row, err := replayCopy(r, res.ReplayID)
			if err != nil {
				return res, err
			}
			in.Rows[j] = row
		}
		if _, err := s.s.d.Insert(ctx, s.db, in); err != nil {
			return res, fmt.Errorf("outbox: write replayed events into %s: %w", s.s.table, err)
		}
		res.Replayed += int64(len(rows))
	}
	s.logger.Info("outbox: replayed published events", watermill.LogFields{"replay_id": res.ReplayID.String(), "selected": res.Selected,
		"replayed": res.Replayed, "since": df.Since, "until": df.Until, "duration": time.Since(start)})
	return res, nil
}

// replayCopy returns the row that copies r under a new UUIDv7, its headers marked with the
// replay (MetadataReplayOf keeps a first original's id).
func replayCopy(r dialect.ReplayRow, replay uuid.UUID) (dialect.InsertRow, error) {
	h := map[string]string{}
	if r.Headers != "" && r.Headers != "null" {
		if err := json.Unmarshal([]byte(r.Headers), &h); err != nil {
			return dialect.InsertRow{}, fmt.Errorf("outbox: replay event %s: its headers are not an object of strings: %w", r.ID, err)
		}
	}
	if h[MetadataReplayOf] == "" {
		h[MetadataReplayOf] = r.ID
	}
	h[MetadataReplayID] = replay.String()
	hb, err := json.Marshal(h)
	if err != nil {
		return dialect.InsertRow{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return dialect.InsertRow{}, fmt.Errorf("outbox: replay id: %w", err)
	}
	return dialect.InsertRow{ID: id.String(), Topic: r.Topic, Payload: r.Payload, Headers: string(hb), OrderingKey: r.OrderingKey, Extra: r.Extra}, nil
}
