package outbox_test

import (
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// linkWatch are the packages a program links only for a database it uses: the database/sql
// drivers, the SQL of the dialects that are not built into the root package, and
// watermill-sql (whose import links lib/pq). Each entry covers its subpackages.
var linkWatch = []string{
	"github.com/ThreeDotsLabs/watermill-sql",
	"github.com/go-sql-driver/mysql",
	"github.com/lib/pq",
	"github.com/mattn/go-sqlite3",
	"github.com/watermill-outbox/outbox/internal/dialect/mysql",
	"github.com/watermill-outbox/outbox/internal/dialect/sqlite",
	"modernc.org/sqlite",
}

// TestDialectDeps lists the packages that the programs under testdata/deps link (go list
// -deps; nothing is built) and checks that each links the drivers and dialect SQL of its own
// database and of no other: a PostgreSQL program links neither MySQL, SQLite nor lib/pq.
func TestDialectDeps(t *testing.T) {
	want := map[string][]string{
		"postgres": nil,
		"sqlite": {
			"github.com/watermill-outbox/outbox/internal/dialect/sqlite",
			"modernc.org/sqlite",
		},
		"mysql": {
			"github.com/go-sql-driver/mysql",
			"github.com/watermill-outbox/outbox/internal/dialect/mysql",
		},
	}
	const prefix = "github.com/watermill-outbox/outbox/testdata/deps/"
	args := []string{"list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}"}
	for name := range want {
		args = append(args, "./testdata/deps/"+name)
	}
	out, err := exec.Command(goCommand(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	got := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		name, ok := strings.CutPrefix(fields[0], prefix)
		if !ok {
			t.Fatalf("go list printed %q", line)
		}
		got[name] = watchedDeps(fields[1:])
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("watched packages linked by each program:\n got %q\nwant %q", got, want)
	}
}

// watchedDeps returns the entries of linkWatch that deps holds, or a subpackage of, in
// linkWatch's order.
func watchedDeps(deps []string) []string {
	var found []string
	for _, w := range linkWatch {
		for _, d := range deps {
			if d == w || strings.HasPrefix(d, w+"/") {
				found = append(found, w)
				break
			}
		}
	}
	return found
}
