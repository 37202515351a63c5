package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/memory"
)

// The relay simulation's world: the memory table behind a recording dialect, the relay
// generations (one Subscriber each, killed and restarted), their destinations, and the log
// the checker reads (simtest_check_test.go).

// simKind is what a log entry records.
type simKind uint8

const (
	simInsert    simKind = iota
	simClaim             // seq leased under token (ds: its delivery starts after the claim)
	simEmit              // seq received by gen's destination (ds: its delivery starts; what: its attempts)
	simAnswer            // the destination's answer (what: simAck …; ds: the delivery's starts)
	simMark              // a mark wrote seq under token (what: the outcome)
	simKill              // gen was killed
	simStart             // gen started
	simLeaseLost         // gen's Hooks.OnLeaseLost
	simFault             // an injected fault in one of gen's operations (what: op)
	simTakeBack          // gen took back leases (ds: how many)
)

// The destination's answers.
const (
	simAck          = "ack"
	simFail         = "fail"
	simPerm         = "perm"
	simUnavailable  = "unavailable"
	simNotAttempted = "not_attempted"
	simSilent       = "silent" // never answered: the DeliveryTimeout fails it
)

// The outcomes a mark writes.
const (
	markAcked       = "acked"
	markReleased    = "released"
	markUnavailable = "unavailable"
	markNotAttempt  = "not_attempted"
	markFailed      = "failed"
	markPerm        = "perm"
	markHeld        = "held"
)

// simEntry is one log entry; i is its place in the log.
type simEntry struct {
	i     int
	at    time.Time
	kind  simKind
	gen   int
	seq   int64
	token string
	what  string
	ds    int
}

func (e simEntry) String() string {
	return fmt.Sprintf("#%d %s gen=%d seq=%d %s %s ds=%d token=%s", e.i, e.at.Format("15:04:05.000000"), e.gen, e.seq,
		[]string{"insert", "claim", "emit", "answer", "mark", "kill", "start", "lease-lost", "fault", "take-back"}[e.kind], e.what, e.ds, e.token)
}

// simGen is one relay process: a Subscriber with its own killable executor.
type simGen struct {
	id, slot int
	name     string
	ex       *memory.Executor
	sub      *Subscriber
	cancel   context.CancelFunc
	killed   atomic.Bool
	emits    atomic.Int64
	started  time.Time
	prefix   string // the Subscriber's token prefix, learnt from its first claim (guarded by simWorld.mu)
}

// simWorld is one seed's world. Its log and maps are guarded by mu.
type simWorld struct {
	p  simPlan
	db *memory.DB

	mu     sync.Mutex
	log    []simEntry
	gens   []*simGen
	byEx   map[dialect.Executor]*simGen
	nth    map[int64]int  // seq → deliveries emitted so far
	faults map[string]int // gen/op → operations so far
	held   []*simHeld     // leases of killed generations
	wg     sync.WaitGroup // destinations' handlers and closing Subscribers
	// crash[slot] asks the slot's crash loop to kill the generation sent (the poison event's
	// destination does); set before the relays start.
	crash []chan *simGen
}

// simHeld is the unexpired leases a killed generation held, and those still held under its
// tokens simRetakeBound after its successor started (the checker's (f)).
type simHeld struct {
	killed *simGen
	at     time.Time
	seqs   []int64
	// checked: the successor lived through the bound; stuck are the events still leased by
	// the killed generation then.
	checked bool
	stuck   []int64
}

// simRetakeBound is how soon after a killed relay's successor (the same RelayName) starts the
// events the killed relay held must no longer be leased under its tokens: the successor takes
// them back when its subscription starts, before its first claim.
func simRetakeBound(c SubscriberConfig) time.Duration { return 2 * c.PollInterval }

func (w *simWorld) record(e simEntry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e.i, e.at = len(w.log), time.Now()
	w.log = append(w.log, e)
}

// genOf returns the generation of ex (-1: a writer's).
func (w *simWorld) genOf(ex dialect.Executor) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g := w.byEx[ex]; g != nil {
		return g.id
	}
	return -1
}

// hook injects faults into the generations' claims, renewals and marks (p.faultRate per
// million, decided by the seed, the generation and the operation's count).
func (w *simWorld) hook(op memory.Op, after bool, ex dialect.Executor) error {
	g := w.genOf(ex)
	if g < 0 || w.p.faultRate == 0 || op == memory.OpTakeBack {
		return nil
	}
	key := fmt.Sprint(g, op, after)
	w.mu.Lock()
	n := w.faults[key]
	w.faults[key] = n + 1
	w.mu.Unlock()
	if simHash(w.p.seed, 1, int64(g), int64(strings.Index("claim renew mark", string(op))), boolInt(after), int64(n))%1_000_000 >= uint64(w.p.faultRate) {
		return nil
	}
	w.record(simEntry{kind: simFault, gen: g, what: fmt.Sprintf("%s after=%v", op, after)})
	return errors.New("injected fault")
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// simDialect is the memory dialect with its relays' claims, marks and take-backs logged.
type simDialect struct {
	*memory.DB
	w *simWorld
}

func (d simDialect) NewRelay(t *dialect.Table, cfg dialect.RelayConfig, sel dialect.TopicSelection) dialect.Relay {
	return &simRelay{Relay: d.DB.NewRelay(t, cfg, sel), w: d.w}
}

func (d simDialect) TakeBack(ctx context.Context, ex dialect.Executor, t *dialect.Table, name, prefix string) (int64, error) {
	n, err := d.DB.TakeBack(ctx, ex, t, name, prefix)
	if n > 0 {
		d.w.record(simEntry{kind: simTakeBack, gen: d.w.genOf(ex), ds: int(n)})
	}
	return n, err
}

type simRelay struct {
	dialect.Relay
	w *simWorld
}

// Claim logs the leased events, also when an injected fault hides them from the relay.
func (r *simRelay) Claim(ctx context.Context, ex dialect.Executor, p *dialect.ClaimParams) (*dialect.ClaimResult, error) {
	res, err := r.Relay.Claim(ctx, ex, p)
	r.w.mu.Lock()
	if g := r.w.byEx[ex]; g != nil && g.prefix == "" {
		g.prefix = p.Token[:strings.LastIndexByte(p.Token, '#')+1]
	}
	r.w.mu.Unlock()
	if res != nil {
		g := r.w.genOf(ex)
		for i, e := range res.Events {
			r.w.record(simEntry{kind: simClaim, gen: g, seq: e.Sequence, token: p.Token, ds: e.DeliveryStarts})
			// The lease's token rides in the copy's headers, so that the destination's log
			// says which lease a delivery belongs to (a relay may deliver a copy of a lease it
			// lost beside a newer lease of the same event with the same delivery starts).
			res.Events[i].Headers = simTagHeaders(e.Headers, p.Token)
		}
	}
	return res, err
}

// Mark logs the rows the mark wrote, also when an injected fault hides them from the relay.
func (r *simRelay) Mark(ctx context.Context, ex dialect.Executor, m *dialect.MarkParams) ([]dialect.MarkResult, error) {
	res, err := r.Relay.Mark(ctx, ex, m)
	what := map[int64]string{}
	for _, s := range m.Acked {
		what[s] = markAcked
	}
	for _, s := range m.Released {
		what[s] = markReleased
	}
	for i, s := range m.Unavailable {
		what[s] = markUnavailable
		if m.Keep[i] {
			what[s] = markNotAttempt
		}
	}
	for _, s := range m.Held {
		what[s] = markHeld
	}
	for i, s := range m.Failed {
		what[s] = markFailed
		if m.Perm[i] {
			what[s] = markPerm
		}
	}
	g := r.w.genOf(ex)
	for _, x := range res {
		r.w.record(simEntry{kind: simMark, gen: g, seq: x.Seq, token: m.Token, what: what[x.Seq]})
	}
	return res, err
}

// start runs a new generation in slot under name.
func (w *simWorld) start(ctx context.Context, slot int, name string) (*simGen, error) {
	g := &simGen{slot: slot, name: name, ex: &memory.Executor{}, started: time.Now()}
	w.mu.Lock()
	g.id = len(w.gens)
	w.gens = append(w.gens, g)
	w.byEx[g.ex] = g
	w.mu.Unlock()
	cfg := w.p.cfg
	cfg.RelayName = name
	cfg.Hooks.OnLeaseLost = func(LeaseLostInfo) { w.record(simEntry{kind: simLeaseLost, gen: g.id}) }
	sub, err := newSubscriberOn(g.ex, simDialect{DB: w.db, w: w}, cfg, nil)
	if err != nil {
		return nil, err
	}
	g.sub = sub
	w.record(simEntry{kind: simStart, gen: g.id})
	sctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	ch, err := sub.Subscribe(sctx, "*")
	if err != nil {
		cancel()
		return nil, err
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for msg := range ch {
			w.wg.Add(1)
			go w.answer(g, msg)
		}
	}()
	return g, nil
}

// kill stops g as kill -9 would: nothing it sends reaches the table any more, its destination
// stops answering, and its process goes away (Subscribe's context, Close). The unexpired leases
// it held are noted for the checker.
func (w *simWorld) kill(g *simGen) *simHeld {
	g.killed.Store(true)
	g.ex.Kill()
	w.record(simEntry{kind: simKill, gen: g.id})
	h := simHeld{killed: g, at: time.Now()}
	w.mu.Lock()
	prefix := g.prefix
	w.mu.Unlock()
	for _, r := range w.db.Rows() {
		if prefix == "" {
			break // it never claimed
		}
		if r.PublishedAt.IsZero() && r.DeadLetteredAt.IsZero() && strings.HasPrefix(r.LeasedBy, prefix) && r.LeaseUntil.After(h.at) {
			h.seqs = append(h.seqs, r.Sequence)
		}
	}
	w.mu.Lock()
	w.held = append(w.held, &h)
	w.mu.Unlock()
	w.stop(g)
	return &h
}

// retaken checks, simRetakeBound after next (the successor of h.killed) started, which of h's
// events are still leased under the killed generation's tokens.
func (w *simWorld) retaken(h *simHeld, next *simGen) {
	time.Sleep(simRetakeBound(w.p.cfg))
	if next.killed.Load() {
		return
	}
	now := time.Now()
	rows := w.db.Rows()
	w.mu.Lock()
	defer w.mu.Unlock()
	h.checked = h.killed.prefix != "" // a generation that never claimed held nothing
	for _, r := range rows {
		if !h.checked {
			break
		}
		if r.PublishedAt.IsZero() && r.DeadLetteredAt.IsZero() && strings.HasPrefix(r.LeasedBy, h.killed.prefix) && r.LeaseUntil.After(now) {
			h.stuck = append(h.stuck, r.Sequence)
		}
	}
}

// stop cancels g's subscription and closes its Subscriber in the background.
func (w *simWorld) stop(g *simGen) {
	g.cancel()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		_ = g.sub.Close()
	}()
}

// answer is g's destination for one message: an outcome decided by the seed, the event and
// its delivery count, given after a virtual delay; nothing once g was killed.
func (w *simWorld) answer(g *simGen, msg *message.Message) {
	defer w.wg.Done()
	seq, _ := strconv.ParseInt(msg.Metadata.Get(MetadataSequence), 10, 64)
	ev, _ := EventFromContext(msg.Context())
	w.mu.Lock()
	n := w.nth[seq]
	w.nth[seq] = n + 1
	w.mu.Unlock()
	token := msg.Metadata.Get(simTokenHeader)
	w.record(simEntry{kind: simEmit, gen: g.id, seq: seq, ds: ev.DeliveryStarts, what: strconv.Itoa(ev.Attempts), token: token})
	if seq == w.p.poison {
		select { // the delivery kills its relay; a kill already asked for is enough
		case w.crash[g.slot] <- g:
		default:
		}
		return
	}
	h := simHash(w.p.seed, 2, seq, int64(n))
	out := w.p.outcome(h % 1000)
	if (h>>20)%100 < uint64(w.p.slowPct) {
		time.Sleep(time.Duration((h>>32)%uint64(w.p.cfg.DeliveryTimeout/2/time.Millisecond)) * time.Millisecond)
	}
	if g.killed.Load() {
		return
	}
	w.record(simEntry{kind: simAnswer, gen: g.id, seq: seq, what: out, ds: ev.DeliveryStarts, token: token})
	switch out {
	case simAck:
		msg.Ack()
	case simFail:
		msg.Nack()
	case simPerm:
		SetNackError(msg, Permanent(errors.New("refused")))
		msg.Nack()
	case simUnavailable:
		SetNackError(msg, &UnavailableError{Destination: ev.Topic, Err: errors.New("down")})
		msg.Nack()
	case simNotAttempted:
		SetNackError(msg, NotAttempted(errors.New("connection dropped")))
		msg.Nack()
	}
}

// simHash mixes its arguments (splitmix64 steps).
func simHash(xs ...int64) uint64 {
	h := uint64(0x9e3779b97f4a7c15)
	for _, x := range xs {
		h ^= uint64(x)
		h += 0x9e3779b97f4a7c15
		h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9
		h = (h ^ (h >> 27)) * 0x94d049bb133111eb
		h ^= h >> 31
	}
	return h
}

// simTokenHeader is the header the simulation adds to each claimed copy: its lease's token.
const simTokenHeader = "sim-lease-token"

// simTagHeaders returns the headers object h with simTokenHeader set to token.
func simTagHeaders(h, token string) string {
	m := map[string]string{}
	if h != "" && h != "null" {
		if err := json.Unmarshal([]byte(h), &m); err != nil {
			panic(fmt.Sprintf("simulation: headers %q: %v", h, err))
		}
	}
	m[simTokenHeader] = token
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}
