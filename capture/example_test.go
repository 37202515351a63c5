package capture_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// Install generates triggers that write an outbox event for every INSERT, UPDATE and DELETE
// of a table, in the writing transaction, whatever wrote it. SQLite here; PostgreSQL takes
// the same calls.
func ExampleInstall() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	if _, err := db.Exec(`CREATE TABLE loan (id INTEGER PRIMARY KEY, status TEXT NOT NULL, token TEXT)`); err != nil {
		panic(err)
	}
	if err := capture.Install(ctx, db, schema, capture.Table{Name: "loan", Exclude: []string{"token"}}); err != nil {
		panic(err)
	}

	// Plain SQL, no outbox call: the triggers write the events.
	for _, stmt := range []string{
		`INSERT INTO loan (id, status, token) VALUES (7, 'open', 'secret')`,
		`UPDATE loan SET status = 'closed' WHERE id = 7`,
		`UPDATE loan SET token = 'rotated' WHERE id = 7`, // no carried column changed: no event
		`DELETE FROM loan WHERE id = 7`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			panic(err)
		}
	}

	rows, err := db.Query(`SELECT topic, ordering_key, payload FROM watermill_outbox ORDER BY sequence`)
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	for rows.Next() {
		var topic, key string
		var payload []byte
		if err := rows.Scan(&topic, &key, &payload); err != nil {
			panic(err)
		}
		change, err := capture.DecodePayload(payload) // downstream: capture.Decode(msg)
		if err != nil {
			panic(err)
		}
		row := change.After // PayloadAfter (the default): the row after the change, before a delete
		if change.Operation == capture.Deleted {
			row = change.Before
		}
		fmt.Println(topic, key, change.Changed, string(row))
	}
	// Output:
	// loan.inserted loan:7 [id status] {"id":7,"status":"open"}
	// loan.updated loan:7 [status] {"id":7,"status":"closed"}
	// loan.deleted loan:7 [id status] {"id":7,"status":"closed"}
}
