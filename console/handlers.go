package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox"
)

// page is what every template gets.
type page struct {
	Title    string
	Path     string
	ReadOnly bool
	Actor    string
	Login    bool // a token login is possible
	CSRF     string
	Msg      string
	Data     any
}

func parseTemplates() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"ago":   ago,
		"num":   num,
		"int64": func(n int) int64 { return int64(n) },
		"atleast": func(n int64, capped bool) string {
			if capped {
				return num(n) + "+"
			}
			return num(n)
		},
		"utc":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"since": func(now, t time.Time) string { return ago(now.Sub(t)) },
		"until": func(now, t time.Time) string { return ago(t.Sub(now)) },
	}
	out := map[string]*template.Template{}
	for _, name := range []string{"overview", "keys", "dead", "confirm", "done", "event", "destinations", "audit", "replay", "replayconfirm", "login", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// num writes n with thousands separators: 2,500.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	c.renderStatus(w, r, http.StatusOK, name, title, data)
}

func (c *Console) renderStatus(w http.ResponseWriter, r *http.Request, code int, name, title string, data any) {
	p := page{Title: title, Path: r.URL.Path, ReadOnly: c.ReadOnly(), Actor: c.actor(r), Login: c.cfg.Token != "",
		CSRF: c.csrfToken(w, r), Msg: r.URL.Query().Get("msg"), Data: data}
	var buf bytes.Buffer
	if err := c.tpl[name].Execute(&buf, p); err != nil {
		http.Error(w, "template: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = buf.WriteTo(w)
}

// fail answers err as an error page with its status.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := statusOf(err)
	c.renderStatus(w, r, code, "error", http.StatusText(code), map[string]any{"Code": code, "Error": err.Error()})
}

// overviewData is the overview page's.
type overviewData struct {
	outbox.BacklogOverview
	Stats     *outbox.DeliveryStats
	StatsErr  string
	Rate      template.HTML
	Delay     template.HTML
	Delivered int64
	PerSec    string
	P95       string
	Leases    []outbox.RelayLease
	// LeasesCapped: more leased events than OverviewLimit (the counts are lower bounds).
	LeasesCapped bool
	LeasesErr    string
	Now          time.Time
}

// overview reads the backlog, the last hour's deliveries and the leases at once (three
// statements on three connections of the pool), so that the page waits for the slowest only.
func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := overviewData{Now: time.Now()}
	var (
		wg               sync.WaitGroup
		bErr, sErr, lErr error
		st               outbox.DeliveryStats
	)
	wg.Add(3)
	go func() { defer wg.Done(); d.BacklogOverview, bErr = c.sub.BacklogOverview(ctx, c.cfg.OverviewLimit) }()
	go func() { defer wg.Done(); st, sErr = c.sub.DeliveryStats(ctx, time.Hour) }()
	go func() {
		defer wg.Done()
		var lr outbox.LeaseReport
		lr, lErr = c.sub.RelayLeases(ctx, c.cfg.OverviewLimit)
		d.Leases, d.LeasesCapped = lr.Relays, lr.Capped
	}()
	wg.Wait()
	if bErr != nil {
		c.fail(w, r, bErr)
		return
	}
	if sErr != nil {
		d.StatsErr = sErr.Error()
	} else if len(st.Minutes) > 0 {
		d.Stats = &st
		d.Rate, d.Delay = rateChart(st), delayChart(st)
		var worst time.Duration
		for _, m := range st.Minutes {
			d.Delivered += m.Delivered
			worst = max(worst, m.P95Delay)
		}
		span := st.Now.Sub(st.Minutes[0].Minute)
		d.PerSec = fmt.Sprintf("%.1f", float64(d.Delivered)/max(span.Seconds(), 1))
		d.P95 = ago(worst)
	}
	if lErr != nil {
		d.LeasesErr = lErr.Error()
	}
	c.render(w, r, "overview", "Overview", d)
}

// keysData is the blocked-keys page's.
type keysData struct {
	Keys    []outbox.BlockedKey
	Limit   int
	MaxHeld int64
}

func (c *Console) keys(w http.ResponseWriter, r *http.Request) {
	ks, err := c.sub.BlockedKeys(r.Context(), c.cfg.PageSize)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "keys", "Blocked keys", keysData{Keys: ks, Limit: c.cfg.PageSize, MaxHeld: outbox.MaxHeldCount})
}

// keyAction runs POST /keys/{retry|skip|purge}.
func (c *Console) keyAction(w http.ResponseWriter, r *http.Request, who string) error {
	h := outbox.KeyHead{Key: r.PostFormValue("key")}
	seq, err := strconv.ParseInt(r.PostFormValue("seq"), 10, 64)
	if err != nil {
		return &errStatus{http.StatusBadRequest, "bad seq: " + r.PostFormValue("seq")}
	}
	h.Sequence = seq
	var op func(context.Context, outbox.KeyHead) error
	action := r.PathValue("action")
	switch action {
	case "retry":
		op = c.sub.RetryKeyHead
	case "skip":
		op = c.sub.SkipKeyHead
	case "purge":
		op = c.sub.PurgeKeyHead
	default:
		return &errStatus{http.StatusNotFound, "unknown action " + action}
	}
	err = op(r.Context(), h)
	var n int64
	if err == nil {
		n = 1
	}
	target := fmt.Sprintf("key=%q head=%d", h.Key, h.Sequence)
	if aerr := c.log(r.Context(), who, action+"-head", target, n, err); aerr != nil {
		return aerr
	}
	if err != nil {
		return err
	}
	verb := map[string]string{"retry": "retried", "skip": "skipped (dead-lettered)", "purge": "purged"}[action]
	http.Redirect(w, r, "/keys?msg="+url.QueryEscape(fmt.Sprintf("head %d of key %q %s", h.Sequence, h.Key, verb)), http.StatusSeeOther)
	return nil
}

// log records an action in the audit table and logs it.
func (c *Console) log(ctx context.Context, who, action, target string, n int64, err error) error {
	e := AuditEntry{Actor: who, Action: action, Target: target, Affected: n}
	fields := watermill.LogFields{"actor": who, "action": action, "target": target, "affected": n}
	if err != nil {
		e.Error = err.Error()
		fields["error"] = e.Error
	}
	c.logger.Info("outbox console action", fields)
	return c.audit.record(ctx, e)
}

// deadQuery is the dead-letter filter as the forms carry it.
type deadQuery struct {
	Topic, Key, Error, After, Before string
}

func deadQueryOf(v url.Values) deadQuery {
	q := deadQuery{Topic: strings.TrimSpace(v.Get("topic")), Key: v.Get("key"), Error: v.Get("error"), After: v.Get("after"), Before: v.Get("before")}
	if q.Topic == "" {
		q.Topic = "*"
	}
	return q
}

// Values is q as URL query values.
func (q deadQuery) Values() template.URL {
	v := url.Values{"topic": {q.Topic}}
	for k, s := range map[string]string{"key": q.Key, "error": q.Error, "after": q.After, "before": q.Before} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return template.URL(v.Encode())
}

// String describes q for the audit log.
func (q deadQuery) String() string {
	b, _ := json.Marshal(map[string]string{"topic": q.Topic, "key": q.Key, "error": q.Error, "after": q.After, "before": q.Before})
	return string(b)
}

// timeForm is the layout of the datetime-local inputs, read as UTC.
const timeForm = "2006-01-02T15:04"

// formTime is a time field of a form: its name, its value, where it is parsed to.
type formTime struct {
	name, value string
	dst         *time.Time
}

// parseTimes parses each field given: a datetime-local value read as UTC, or RFC 3339
// (fractional seconds accepted); "" leaves the destination zero. A bad one is a 400.
func parseTimes(fs ...formTime) error {
	for _, f := range fs {
		if f.value == "" {
			continue
		}
		t, err := time.Parse(timeForm, f.value)
		if err != nil {
			if t, err = time.Parse(time.RFC3339, f.value); err != nil {
				return &errStatus{http.StatusBadRequest, fmt.Sprintf("%s: %q is not a time like 2026-12-06T18:30 (UTC)", f.name, f.value)}
			}
		}
		*f.dst = t.UTC()
	}
	return nil
}

func (q deadQuery) filter() (outbox.DeadLetterFilter, error) {
	f := outbox.DeadLetterFilter{Topics: []string{q.Topic}, Key: q.Key, ErrorContains: q.Error}
	return f, parseTimes(formTime{"after", q.After, &f.DeadAfter}, formTime{"before", q.Before, &f.DeadBefore})
}

// deadData is the dead-letter page's.
type deadData struct {
	Q     deadQuery
	Count int64
	List  []outbox.DeadLetter
	Err   string
}

func (c *Console) dead(w http.ResponseWriter, r *http.Request) {
	d := deadData{Q: deadQueryOf(r.URL.Query())}
	f, err := d.Q.filter()
	if err == nil {
		// The count and the page at once: both read the dead letters (dead_idx), so the
		// page waits for one of them, not for their sum.
		var wg sync.WaitGroup
		var lErr error
		wg.Add(1)
		go func() { defer wg.Done(); d.List, lErr = c.sub.ListDeadLettered(r.Context(), f, c.cfg.PageSize) }()
		d.Count, err = c.sub.CountDeadLettered(r.Context(), f)
		wg.Wait()
		err = cmp.Or(err, lErr)
	}
	if err != nil {
		if statusOf(err) == http.StatusInternalServerError {
			c.fail(w, r, err)
			return
		}
		d.Err = err.Error()
	}
	c.render(w, r, "dead", "Dead letters", d)
}

// confirmData is the confirmation page's.
type confirmData struct {
	Q      deadQuery
	Action string
	Count  int64
}

func (c *Console) deadConfirm(w http.ResponseWriter, r *http.Request) {
	d := confirmData{Q: deadQueryOf(r.URL.Query()), Action: r.URL.Query().Get("action")}
	if d.Action != "retry" && d.Action != "purge" {
		c.fail(w, r, &errStatus{http.StatusBadRequest, "action must be retry or purge"})
		return
	}
	f, err := d.Q.filter()
	if err == nil {
		d.Count, err = c.sub.CountDeadLettered(r.Context(), f)
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "confirm", "Confirm", d)
}

// doneData is the result page of an action on dead letters.
type doneData struct {
	Q        deadQuery
	Action   string
	Expected int64
	Affected int64
}

func (c *Console) deadApply(w http.ResponseWriter, r *http.Request, who string) error {
	d := doneData{Q: deadQueryOf(r.PostForm), Action: r.PostFormValue("action")}
	d.Expected, _ = strconv.ParseInt(r.PostFormValue("count"), 10, 64)
	f, err := d.Q.filter()
	if err != nil {
		return err
	}
	switch d.Action {
	case "retry":
		d.Affected, err = c.sub.RetryDeadLettered(r.Context(), f)
	case "purge":
		d.Affected, err = c.sub.PurgeDeadLettered(r.Context(), f)
	default:
		return &errStatus{http.StatusBadRequest, "action must be retry or purge"}
	}
	if aerr := c.log(r.Context(), who, d.Action+"-dead", d.Q.String(), d.Affected, err); aerr != nil {
		return aerr
	}
	if err != nil {
		return err
	}
	c.render(w, r, "done", "Done", d)
	return nil
}

// eventData is the dead letter's detail page's.
type eventData struct {
	E            outbox.DeadLetter
	Headers      [][2]string
	Payload      string
	ShowPayloads bool
}

func (c *Console) deadEvent(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.URL.Query().Get("id"))
	if err != nil {
		c.fail(w, r, &errStatus{http.StatusBadRequest, "bad event id"})
		return
	}
	l, err := c.sub.ListDeadLettered(r.Context(), outbox.DeadLetterFilter{IDs: []uuid.UUID{id}}, 1)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if len(l) == 0 {
		c.fail(w, r, &errStatus{http.StatusNotFound, "no dead letter " + id.String() + " (retried or purged meanwhile?)"})
		return
	}
	d := eventData{E: l[0], ShowPayloads: c.cfg.ShowPayloads}
	for k, v := range d.E.Headers {
		d.Headers = append(d.Headers, [2]string{k, v})
	}
	sort.Slice(d.Headers, func(i, j int) bool { return d.Headers[i][0] < d.Headers[j][0] })
	if c.cfg.ShowPayloads {
		var pretty bytes.Buffer
		if json.Indent(&pretty, d.E.Payload, "", "  ") == nil {
			d.Payload = pretty.String()
		} else {
			d.Payload = fmt.Sprintf("%q", d.E.Payload)
		}
	}
	c.render(w, r, "event", "Dead letter", d)
}

func (c *Console) destinations(w http.ResponseWriter, r *http.Request) {
	type limit struct {
		Destination string
		outbox.DestinationLimit
	}
	var d struct {
		InRelay bool
		Outages []outbox.Outage
		Limits  []limit
		Now     time.Time
	}
	d.Now = time.Now()
	if c.cfg.Outages != nil {
		d.InRelay = true
		d.Outages = c.cfg.Outages.Outages()
		if ls, ok := c.cfg.Outages.(LimitSource); ok {
			for name, l := range ls.DestinationLimits() {
				if l.Rate > 0 && l.Burst <= 0 {
					l.Burst = max(1, int(l.Rate/10)) // the default the relay applies
				}
				d.Limits = append(d.Limits, limit{name, l})
			}
			sort.Slice(d.Limits, func(i, j int) bool { return d.Limits[i].Destination < d.Limits[j].Destination })
		}
	}
	c.render(w, r, "destinations", "Destinations", d)
}

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) {
	l, err := c.audit.list(r.Context(), 200)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "audit", "Audit log", l)
}
