package router_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/router"
)

// rec is a destination that records what it got and can fail chosen messages.
type rec struct {
	name   string
	mu     sync.Mutex
	got    []string // "topic/uuid"
	fail   map[string]bool
	closed int
}

func (r *rec) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if r.fail[m.UUID] {
			return fmt.Errorf("%s refused %s", r.name, m.UUID)
		}
		r.got = append(r.got, topic+"/"+m.UUID)
	}
	return nil
}

func (r *rec) Close() error {
	r.mu.Lock()
	r.closed++
	r.mu.Unlock()
	return nil
}

func (r *rec) topics() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// batchRec is a destination that takes batches.
type batchRec struct {
	rec
	calls int
}

func (b *batchRec) PublishBatch(_ context.Context, batch []forwarder.Outgoing) []error {
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	errs := make([]error, len(batch))
	for i, o := range batch {
		errs[i] = b.Publish(o.Topic, o.Message)
	}
	return errs
}

func TestRouting(t *testing.T) {
	exact, first, second, def := &rec{name: "exact"}, &rec{name: "first"}, &rec{name: "second"}, &rec{name: "default"}
	cfg := router.Config{Routes: []router.Route{
		{Topic: "orders.*", Publisher: first},
		{Topic: "orders.p*", Publisher: second}, // shadowed by "orders.*" for every topic it matches
		{Topic: "orders.paid", Publisher: exact},
		{Topic: "a_b%*", Publisher: second},
	}}
	cases := []struct {
		topic string
		want  *rec
		def   bool // with Default set
	}{
		{"orders.paid", exact, false},   // exact beats a pattern declared before it
		{"orders.placed", first, false}, // first matching pattern wins
		{"orders.", first, false},       // a prefix pattern matches the bare prefix
		{"a_b%x", second, false},        // '_' and '%' are ordinary
		{"axb%x", nil, false},           // no route, no default
		{"billing.x", nil, false},       // no route, no default
		{"billing.x", def, true},        // default catches
		{"orders.paid", exact, true},    // routes still win over the default
		{"orders.paidx", first, true},   // exact means exact
		{"order", def, true},            // not a prefix match
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/default=%v", c.topic, c.def), func(t *testing.T) {
			cfg := cfg
			if c.def {
				cfg.Default = def
			}
			p, err := router.New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Route(c.topic)
			if c.want == nil {
				var nr *router.NoRouteError
				if !errors.Is(err, router.ErrNoRoute) || !errors.As(err, &nr) || nr.Topic != c.topic {
					t.Fatalf("Route(%q) = %v, %v; want *NoRouteError", c.topic, got, err)
				}
				if err := p.Publish(c.topic, message.NewMessage("x", nil)); !errors.Is(err, router.ErrNoRoute) {
					t.Fatalf("Publish(%q) = %v, want ErrNoRoute", c.topic, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("Route(%q) = %v, %v; want %s", c.topic, got, err, c.want.name)
			}
		})
	}
}

func TestPublishGoesToTheRoute(t *testing.T) {
	a, b := &rec{name: "a"}, &rec{name: "b"}
	p, err := router.New(router.Config{Routes: []router.Route{{Topic: "a.*", Publisher: a}}, Default: b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := message.NewMessage("1", nil), message.NewMessage("2", nil)
	if err := p.Publish("a.x", m1, m2); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish("z", m1); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(a.topics()) != "[a.x/1 a.x/2]" || fmt.Sprint(b.topics()) != "[z/1]" {
		t.Fatalf("a got %v, b got %v", a.topics(), b.topics())
	}
}

func TestConfigValidate(t *testing.T) {
	pub := &rec{}
	cases := []struct {
		name  string
		cfg   router.Config
		field string
	}{
		{"zero value is valid", router.Config{}, ""},
		{"nil publisher", router.Config{Routes: []router.Route{{Topic: "a", Publisher: nil}}}, "router.Config.Routes[0].Publisher"},
		{"empty topic", router.Config{Routes: []router.Route{{Topic: "", Publisher: pub}}}, "router.Config.Routes[0].Topic"},
		{"star inside", router.Config{Routes: []router.Route{{Topic: "a", Publisher: pub}, {Topic: "a*b", Publisher: pub}}}, "router.Config.Routes[1].Topic"},
		{"question mark", router.Config{Routes: []router.Route{{Topic: "a?", Publisher: pub}}}, "router.Config.Routes[0].Topic"},
		{"duplicate", router.Config{Routes: []router.Route{{Topic: "a*", Publisher: pub}, {Topic: "a*", Publisher: pub}}}, "router.Config.Routes[1].Topic"},
		{"star alone", router.Config{Routes: []router.Route{{Topic: "*", Publisher: pub}}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ce *outbox.ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, outbox.ErrConfig) {
				t.Fatalf("Validate = %v, want a ConfigError on %s", err, c.field)
			}
			if _, err := router.New(c.cfg, nil); !errors.Is(err, outbox.ErrConfig) {
				t.Fatalf("New = %v, want ErrConfig", err)
			}
		})
	}
}

func TestPublishBatch(t *testing.T) {
	single, batched := &rec{name: "single", fail: map[string]bool{}}, &batchRec{rec: rec{name: "batched"}}
	p, err := router.New(router.Config{Routes: []router.Route{
		{Topic: "s.*", Publisher: single},
		{Topic: "b.*", Publisher: batched},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var batch []forwarder.Outgoing
	add := func(topic, id, key string) {
		m := message.NewMessage(id, nil)
		if key != "" {
			outbox.SetOrderingKey(m, key)
		}
		batch = append(batch, forwarder.Outgoing{Topic: topic, Message: m})
	}
	add("s.x", "s1", "k1")
	add("b.x", "b1", "k2")
	add("s.x", "s2", "k1") // fails
	add("z", "z1", "")     // no route
	add("b.y", "b2", "k2")
	add("s.x", "s3", "k1") // held back behind s2
	add("s.y", "s4", "k3")
	single.fail["s2"] = true
	errs := p.PublishBatch(context.Background(), batch)
	want := []string{"<nil>", "<nil>", "single refused s2", "router: no route for topic \"z\"", "<nil>", forwarder.ErrHeldBack.Error(), "<nil>"}
	for i, err := range errs {
		if fmt.Sprint(err) != want[i] {
			t.Errorf("result %d (%s) = %v, want %s", i, batch[i].Message.UUID, err, want[i])
		}
	}
	if !errors.Is(errs[3], router.ErrNoRoute) || !errors.Is(errs[5], forwarder.ErrHeldBack) {
		t.Errorf("typed errors: %v, %v", errs[3], errs[5])
	}
	// A per-message destination gets different keys concurrently: their order is free.
	got := single.topics()
	slices.Sort(got)
	if fmt.Sprint(got) != "[s.x/s1 s.y/s4]" || fmt.Sprint(batched.topics()) != "[b.x/b1 b.y/b2]" || batched.calls != 1 {
		t.Errorf("single got %v; batched got %v in %d calls", single.topics(), batched.topics(), batched.calls)
	}
}

func TestClose(t *testing.T) {
	a, b := &rec{}, &rec{}
	fn := forwarder.Func(func(context.Context, *message.Message) error { return nil })
	p, err := router.New(router.Config{Routes: []router.Route{
		{Topic: "a", Publisher: a}, {Topic: "a2", Publisher: a}, {Topic: "f", Publisher: fn},
	}, Default: b, CloseDestinations: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if a.closed != 1 || b.closed != 1 {
		t.Errorf("closed a %d times, b %d times; want once each", a.closed, b.closed)
	}
	if err := p.Publish("a", message.NewMessage("1", nil)); !errors.Is(err, router.ErrClosed) {
		t.Errorf("Publish after Close = %v", err)
	}
	errs := p.PublishBatch(context.Background(), []forwarder.Outgoing{{Topic: "a", Message: message.NewMessage("1", nil)}})
	if !errors.Is(errs[0], router.ErrClosed) {
		t.Errorf("PublishBatch after Close = %v", errs[0])
	}

	// Without CloseDestinations nothing is closed.
	c := &rec{}
	p2, _ := router.New(router.Config{Default: c}, nil)
	_ = p2.Close()
	if c.closed != 0 {
		t.Errorf("destination closed without CloseDestinations")
	}
}
