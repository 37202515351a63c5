package mysql

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// Times and values read the same whatever the DSN's parseTime, loc and interpolateParams
// (text protocol: every value arrives as text).
func TestDriverSettings(t *testing.T) {
	needDB(t)
	base := os.Getenv("OUTBOX_MYSQL_DSN")
	if base == "" {
		base = "root@tcp(127.0.0.1:3306)/test"
	}
	for _, opts := range []string{"parseTime=true&loc=America%2FNew_York", "interpolateParams=true", "parseTime=true&interpolateParams=true&loc=Asia%2FTokyo"} {
		t.Run(opts, func(t *testing.T) {
			db, err := sql.Open("mysql", base+"?"+opts)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			tb := newTable(t, withExtra(dialect.Column{Name: "n", Type: "INT NULL"}))
			ctx, d := context.Background(), New()
			r := ev("t", `1`, "k", "")
			r.Extra = ptr(`{"n":42}`)
			out, err := d.Insert(ctx, sqlEx(db), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{r}, ExtraNames: []string{"n"}})
			if err != nil {
				t.Fatal(err)
			}
			if age := time.Since(out[0].CreatedAt); age < -5*time.Second || age > 5*time.Second || out[0].CreatedAt.Location() != time.UTC {
				t.Fatalf("created_at %v is %v from now", out[0].CreatedAt, age)
			}
			cfg := relayConfig(10, 10)
			rel := d.NewRelay(tb, cfg, all)
			res, err := rel.Claim(ctx, sqlEx(db), &dialect.ClaimParams{Token: "x", Limit: 10, Oldest: 10})
			if err != nil || len(res.Events) != 1 {
				t.Fatalf("claim: %+v, %v", res, err)
			}
			e := res.Events[0]
			if !e.CreatedAt.Equal(out[0].CreatedAt) || len(e.Extra) != 1 || (e.Extra[0] != int64(42) && e.Extra[0] != "42") {
				t.Fatalf("claimed %+v (extra %#v)", e, e.Extra)
			}
			mr, err := rel.Mark(ctx, sqlEx(db), &dialect.MarkParams{Token: "x", Failed: []int64{e.Sequence}, Errs: []string{"e"}, Perm: []bool{false}, Jitters: []float64{1}})
			if err != nil || len(mr) != 1 || mr[0].Next == nil {
				t.Fatalf("mark: %+v, %v", mr, err)
			}
			if d := time.Since(mr[0].Now); d < -5*time.Second || d > 5*time.Second {
				t.Fatalf("mark clock %v is %v from now", mr[0].Now, d)
			}
			if !mr[0].Next.Equal(mr[0].Now.Add(time.Second)) {
				t.Fatalf("next %v, want now %v + 1 s", mr[0].Next, mr[0].Now)
			}
			b, err := d.Backlog(ctx, sqlEx(db), tb)
			if err != nil || b.Pending != 1 || b.Held != 0 {
				t.Fatalf("backlog %+v, %v", b, err)
			}
			if age := b.Now.Sub(b.Oldest); age < 0 || age > 5*time.Second {
				t.Fatalf("backlog age %v", age)
			}
		})
	}
}
