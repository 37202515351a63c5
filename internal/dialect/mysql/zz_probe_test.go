package mysql

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

func TestZZMakeProbe(t *testing.T) {
	tb := &dialect.Table{Parts: []string{"zz_probe"}, IndexBase: "zz_probe", LockSeed: 1}
	if err := New().Migrate(t.Context(), sqlEx{testDB}, tb); err != nil {
		t.Fatal(err)
	}
	rows := make([]dialect.InsertRow, 10000)
	for i := range rows {
		k := fmt.Sprintf("key%03d", rand.IntN(100))
		if i%10 == 0 {
			k = ""
		}
		rows[i] = ev("t", `{"n":1}`, k, "")
	}
	mustInsert(t, tb, rows...)
}
