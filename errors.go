package outbox

import (
	"errors"
	"fmt"

	"github.com/watermill-outbox/outbox/internal/engine"
)

// ErrValidation is matched (errors.Is) by every *ValidationError: an event that was refused
// before any SQL ran. The caller's transaction is untouched and can still commit.
var ErrValidation = errors.New("outbox: invalid event")

// ErrConfig is matched (errors.Is) by every *ConfigError: a configuration refused at
// construction.
var ErrConfig = errors.New("outbox: invalid configuration")

// ErrUnsupportedDB is returned (wrapped in a *ConfigError) when a database handle of a type the
// package cannot use is passed to NewPublisher, NewSubscriber or Migrate.
var ErrUnsupportedDB = errors.New("outbox: unsupported database handle")

// ErrClosed is returned by Subscribe and SubscribeBatches after Close. The operations
// (Backlog, RetryDeadLettered, cleanups) keep working after Close: they only run SQL.
var ErrClosed = engine.ErrClosed

// ValidationError describes one refused event. Index is the event's position in the Publish,
// EnqueueMany or PublishEvents call (0-based); Field names the offending part ("topic", "uuid",
// "payload", "headers", "ordering_key", "idempotency_key", "extra_columns"); Reason says why.
//
// It matches ErrValidation with errors.Is.
type ValidationError struct {
	Index  int
	Field  string
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("outbox: invalid event #%d: %s: %s", e.Index, e.Field, e.Reason)
}

// Is reports whether target is ErrValidation.
func (e *ValidationError) Is(target error) bool { return target == ErrValidation }

// ConfigError describes a configuration refused at construction: Field names the config field
// (for example "SubscriberConfig.BatchSize"), Reason says why, Err is an optional cause.
//
// It matches ErrConfig with errors.Is, and its cause with errors.Is/As through Unwrap.
type ConfigError struct {
	Field  string
	Reason string
	Err    error
}

func (e *ConfigError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("outbox: invalid configuration: %s: %s: %v", e.Field, e.Reason, e.Err)
	}
	return fmt.Sprintf("outbox: invalid configuration: %s: %s", e.Field, e.Reason)
}

// Is reports whether target is ErrConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrConfig }

// Unwrap returns the cause, if any.
func (e *ConfigError) Unwrap() error { return e.Err }

// DeliveryError is the error recorded for a failed delivery: the event and the cause (the
// handler's error, a Nack without a recorded error, or the delivery timeout). A DeliveryError
// never reaches the caller of the relay; it is what observers and last_error see.
type DeliveryError struct {
	EventID string
	Topic   string
	Err     error
}

func (e *DeliveryError) Error() string {
	return fmt.Sprintf("outbox: delivery of event %s (topic %q) failed: %v", e.EventID, e.Topic, e.Err)
}

// Unwrap returns the cause.
func (e *DeliveryError) Unwrap() error { return e.Err }

// ErrNacked is the cause recorded when a message is nacked without an error recorded by the
// RecordError middleware.
var ErrNacked = engine.ErrNacked

// ErrLeaseLost is the error logged when a batch's marks were refused by the fencing token: its
// lease had expired and another relay took its events over (and delivers them again).
var ErrLeaseLost = engine.ErrLeaseLost

// ErrPoisonEvent is the cause recorded for an event dead-lettered because its deliveries kept
// starting without an outcome: the relay stopped while delivering it, or the destination never
// judged it (NotAttempted, e.g. it dropped the connection), every time (see
// SubscriberConfig.MaxDeliveryStarts).
var ErrPoisonEvent = engine.ErrPoisonEvent

// ErrDeliveryTimeout is the cause recorded when a message is neither acked nor nacked within
// SubscriberConfig.DeliveryTimeout.
var ErrDeliveryTimeout = engine.ErrDeliveryTimeout

// ErrIdempotencyScopeMismatch is returned (wrapped, with the table, the index found and the
// fix) by Migrate when the table's idempotency index was built for another
// SchemaConfig.IdempotencyScope than the one given: Migrate never swaps the unique index by
// itself; IdempotencyScopeMigrationSQL gives the statements that do.
var ErrIdempotencyScopeMismatch = errors.New("outbox: idempotency index does not match SchemaConfig.IdempotencyScope")

// ErrIdempotencyConflict is matched (errors.Is) by every *IdempotencyConflictError.
var ErrIdempotencyConflict = errors.New("outbox: idempotency key held by an event of another scope")

// IdempotencyConflictError is returned by Publish, PublishEvents, Enqueue and EnqueueMany on a
// table without SchemaConfig.IdempotencyScope when an event's idempotency key is already held
// by a stored event whose extra columns differ from those the event sets (another tenant's
// event): the stored event is never returned. Index is the first such event's position in the
// call, Key its idempotency key. The error may come after the INSERT: inside a transaction
// roll it back (EnqueueMany already rolled back its savepoint); outside one, on PostgreSQL and
// SQLite the call's other events are stored, on MariaDB/MySQL none is (the call runs in a
// transaction of its own there). Give the table an IdempotencyScope to make keys unique per
// tenant.
//
// It matches ErrIdempotencyConflict with errors.Is.
type IdempotencyConflictError struct {
	Index int
	Key   string
}

func (e *IdempotencyConflictError) Error() string {
	return fmt.Sprintf("outbox: event #%d: idempotency key %q is held by a stored event with other extra column values (another tenant's?); set SchemaConfig.IdempotencyScope to scope keys per tenant", e.Index, e.Key)
}

// Is reports whether target is ErrIdempotencyConflict.
func (e *IdempotencyConflictError) Is(target error) bool { return target == ErrIdempotencyConflict }

// ErrNotSupported is matched (errors.Is) by every *NotSupportedError.
var ErrNotSupported = errors.New("outbox: operation not supported by this database")

// NotSupportedError is returned by an operation that the table's database does not serve
// (for example BlockedKeys on SQLite or MariaDB/MySQL): Op names the operation, Database the
// database ("SQLite"). errors.Is(err, ErrNotSupported) holds.
type NotSupportedError struct {
	Op       string
	Database string
}

func (e *NotSupportedError) Error() string {
	return fmt.Sprintf("outbox: %s is not supported on %s (PostgreSQL only)", e.Op, e.Database)
}

// Is reports whether target is ErrNotSupported.
func (e *NotSupportedError) Is(target error) bool { return target == ErrNotSupported }

// ErrHeadMoved is returned by RetryKeyHead, SkipKeyHead and PurgeKeyHead when the event they
// name is no longer its ordering key's failed or dead-lettered head, or is leased by a relay
// (in flight) right now: it was delivered, retried, purged or skipped meanwhile, or a relay is
// trying it. Nothing was changed; read BlockedKeys again.
var ErrHeadMoved = errors.New("outbox: the event is no longer its key's failed head (or is in flight)")
