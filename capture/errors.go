package capture

import (
	"errors"
	"fmt"
	"strings"
)

// Install, SQL and Uninstall refuse a declaration with a *outbox.ConfigError (errors.Is
// outbox.ErrConfig) whose Field names the Table field ("Table[0].Fields") and whose Err is one
// of these sentinels (errors.Is), or an *UnsupportedTypeError. Nothing is installed then.
var (
	// ErrUnknownTable: the table does not exist (or is not a plain table).
	ErrUnknownTable = errors.New("capture: unknown table")
	// ErrUnknownColumn: Fields, Exclude or Key names a column the table does not have.
	ErrUnknownColumn = errors.New("capture: unknown column")
	// ErrFieldsAndExclude: both Fields and Exclude are set.
	ErrFieldsAndExclude = errors.New("capture: Fields and Exclude are mutually exclusive")
	// ErrTemplate: a Topic or OrderingKey template names something other than {schema},
	// {table}, {operation} (Topic) or {pk} (OrderingKey), or has unbalanced braces.
	ErrTemplate = errors.New("capture: invalid template")
	// ErrNoPrimaryKey: the table has no primary key and the declaration gives neither Key nor
	// OrderingKeySQL nor Unordered (or a template uses {pk}).
	ErrNoPrimaryKey = errors.New("capture: table without a primary key")
	// ErrOutboxTable: the declaration captures the outbox table itself (or the outbox table
	// does not exist yet: run outbox.Migrate first).
	ErrOutboxTable = errors.New("capture: the outbox table cannot be captured")
	// ErrPartition: the table is a partition (or a foreign table is one of the partitions of
	// a partitioned table). Declare the partitioned table: its partitions are captured with it.
	ErrPartition = errors.New("capture: a partition is captured through its partitioned table")
	// ErrInheritance: the table has inheritance children or parents (INHERITS; partitions
	// are not meant). A statement runs the statement triggers of the table it names only, so
	// writes naming the other table would change the captured rows without events.
	ErrInheritance = errors.New("capture: table inheritance")
	// ErrEventTrigger: a partitioned table is declared on a PostgreSQL database without the
	// event trigger that gives partitions created or attached later their capture triggers, and
	// the installing role may not create it (only a superuser may create an event trigger).
	// Run Install once as a superuser; later Installs by the table's owner reuse it.
	ErrEventTrigger = errors.New("capture: partitioned table without the capture event trigger")
	// ErrInvalid: any other invalid field (unknown operation or mode, an extension key that is
	// an envelope key, an empty expression, an unknown extra column).
	ErrInvalid = errors.New("capture: invalid declaration")
)

// UnsupportedTypeError names a carried column whose type has no JSON rule (see the package
// doc, "JSON form of values"). It is the Err of the *outbox.ConfigError Install returns; leave
// the column out with Exclude or Fields.
type UnsupportedTypeError struct {
	Table  string
	Column string
	Type   string // the type as the catalog shows it
}

func (e *UnsupportedTypeError) Error() string {
	return fmt.Sprintf("capture: %s.%s: type %s has no JSON rule (leave the column out with Exclude)", e.Table, e.Column, e.Type)
}

// ErrNotCaptured is the sentinel of a *VerifyError (errors.Is): a captured table or one of its
// partitions lacks an enabled capture trigger, so some of its writes produce no event.
var ErrNotCaptured = errors.New("capture: writes without events")

// TriggerProblem is one finding of Verify.
type TriggerProblem struct {
	// Table is the declared (captured) table, "schema.table".
	Table string
	// Relation is the table or partition the finding is about, "schema.table" (equal to
	// Table unless a partition is meant); empty for the event trigger.
	Relation string
	// Trigger is the trigger's name (a table trigger, or the event trigger).
	Trigger string
	// Problem is "missing", "disabled", "not enabled ALWAYS" (replica sessions skip it) or
	// "calls another function".
	Problem string
}

func (p TriggerProblem) String() string {
	if p.Relation == "" {
		return fmt.Sprintf("%s: event trigger %s %s", p.Table, p.Trigger, p.Problem)
	}
	if p.Relation == p.Table {
		return fmt.Sprintf("%s: trigger %s %s", p.Table, p.Trigger, p.Problem)
	}
	return fmt.Sprintf("%s (partition of %s): trigger %s %s", p.Relation, p.Table, p.Trigger, p.Problem)
}

// VerifyError lists every trigger Verify (or Install, which ends with Verify) found missing,
// disabled or not enabled as installed. errors.Is(err, ErrNotCaptured) holds.
type VerifyError struct {
	Problems []TriggerProblem
}

func (e *VerifyError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return fmt.Sprintf("capture: %d capture trigger(s) missing or not enabled, writes there produce no event (re-run Install): %s", len(e.Problems), strings.Join(lines, "; "))
}

// Unwrap returns ErrNotCaptured.
func (e *VerifyError) Unwrap() error { return ErrNotCaptured }
