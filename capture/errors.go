package capture

import (
	"errors"
	"fmt"
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
