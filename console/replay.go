package console

import (
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox"
)

// replayQuery is the replay selection as the forms carry it: a published_at window (UTC),
// topic patterns and ordering keys, each list separated by commas or spaces.
type replayQuery struct {
	Since, Until, Topics, Keys string
}

func replayQueryOf(v url.Values) replayQuery {
	return replayQuery{Since: strings.TrimSpace(v.Get("since")), Until: strings.TrimSpace(v.Get("until")), Topics: v.Get("topics"), Keys: v.Get("keys")}
}

// Values is q as URL query values.
func (q replayQuery) Values() template.URL {
	v := url.Values{}
	for k, s := range map[string]string{"since": q.Since, "until": q.Until, "topics": q.Topics, "keys": q.Keys} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return template.URL(v.Encode())
}

// String describes q for the audit log.
func (q replayQuery) String() string {
	b, _ := json.Marshal(map[string]string{"since": q.Since, "until": q.Until, "topics": q.Topics, "keys": q.Keys})
	return string(b)
}

// fields splits a list given as commas, spaces or lines.
func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' })
}

// filter returns q as an outbox.ReplayFilter; ok is false when no window start is given (the
// form was not filled in yet).
func (q replayQuery) filter() (f outbox.ReplayFilter, ok bool, err error) {
	if q.Since == "" {
		return f, false, nil
	}
	if err := parseTimes(formTime{"since", q.Since, &f.Since}, formTime{"until", q.Until, &f.Until}); err != nil {
		return f, true, err
	}
	f.Topics, f.Keys = fields(q.Topics), fields(q.Keys)
	return f, true, f.Validate()
}

// replayData is the replay pages' (form and dry run, confirmation, result).
type replayData struct {
	Q       replayQuery
	Counted bool
	Count   int64
	Err     string
	Result  *outbox.ReplayResult
}

// dryRun counts what q selects, with the window's end pinned (a zero Until is resolved to
// now, and the links and forms carry the resolved time, so that the confirmation and the
// replay select the same events).
func (c *Console) dryRun(r *http.Request, d *replayData) error {
	f, ok, err := d.Q.filter()
	if err != nil || !ok {
		return err
	}
	res, err := c.sub.Replay(r.Context(), f, outbox.ReplayOptions{DryRun: true})
	if err != nil {
		return err
	}
	d.Counted, d.Count = true, res.Selected
	d.Q.Until = res.Until.UTC().Format(time.RFC3339Nano)
	return nil
}

// replay is GET /replay: the selection form and, once a window is given, the dry run's count.
func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	d := replayData{Q: replayQueryOf(r.URL.Query())}
	if err := c.dryRun(r, &d); err != nil {
		if statusOf(err) == http.StatusInternalServerError {
			c.fail(w, r, err)
			return
		}
		d.Err = err.Error()
	}
	c.render(w, r, "replay", "Replay", d)
}

// replayConfirm is GET /replay/confirm: the count again, and the form that replays.
func (c *Console) replayConfirm(w http.ResponseWriter, r *http.Request) {
	d := replayData{Q: replayQueryOf(r.URL.Query())}
	err := c.dryRun(r, &d)
	if err == nil && !d.Counted {
		err = &errStatus{http.StatusBadRequest, "give the window's start (since)"}
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "replayconfirm", "Confirm replay", d)
}

// replayApply is POST /replay/apply: replays the selection if it still holds the count
// confirmed (outbox.ReplayOptions.Expect), and records it in the audit log.
func (c *Console) replayApply(w http.ResponseWriter, r *http.Request, who string) error {
	d := replayData{Q: replayQueryOf(r.PostForm)}
	expect, err := strconv.ParseInt(r.PostFormValue("count"), 10, 64)
	if err != nil || expect < 1 {
		return &errStatus{http.StatusBadRequest, "bad count: " + r.PostFormValue("count")}
	}
	f, ok, err := d.Q.filter()
	if err == nil && (!ok || f.Until.IsZero()) {
		err = &errStatus{http.StatusBadRequest, "give the window's start and end (since, until)"}
	}
	if err != nil {
		return err
	}
	res, err := c.sub.Replay(r.Context(), f, outbox.ReplayOptions{Expect: expect})
	d.Count, d.Result = expect, &res
	if aerr := c.log(r.Context(), who, "replay", d.Q.String(), res.Replayed, err); aerr != nil {
		return aerr
	}
	if err != nil {
		return err
	}
	c.render(w, r, "replayconfirm", "Replayed", d)
	return nil
}
