package dialect

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
)

// OnePerRow turns what an INSERT … ON CONFLICT DO NOTHING RETURNING statement gave back (the
// inserted events, and possibly stored events of existing idempotency keys marked Duplicate)
// into Insert's answer: one Stored per row of p, in p's order. A row that was not inserted
// takes the stored event of its idempotency key, marked Duplicate: read again with
// d.ResolveScoped when the table is scoped or the call sets extra columns (an unscoped
// table's stored event must agree with every extra column the row sets, else the answer is an
// *IdempotencyConflict for the first such row), otherwise taken from got or read with
// d.ReadStored (a key committed by a concurrent transaction while the statement waited is
// newer than the statement's snapshot). It returns nil for p.NoReturn. Errors name what is
// missing; the caller adds the table.
func OnePerRow(ctx context.Context, d Dialect, ex Executor, p *InsertParams, got []Stored) ([]Stored, error) {
	if p.NoReturn {
		return nil, nil
	}
	n := len(p.Rows)
	if inOrder(p.Rows, got) {
		return got, nil
	}
	byID := make(map[string]Stored, len(got))
	byKey := map[string]Stored{}
	idem := false
	for _, r := range p.Rows {
		idem = idem || r.IdempotencyKey != nil
	}
	for _, st := range got {
		if st.IdempotencyKey != nil {
			if _, seen := byKey[*st.IdempotencyKey]; !seen || !st.Duplicate {
				byKey[*st.IdempotencyKey] = st
			}
		}
		if !st.Duplicate {
			byID[st.ID] = st
		}
	}
	if idem && (len(p.Table.Scope) > 0 || len(p.ExtraNames) > 0) {
		return resolveScoped(ctx, d, ex, p, byID)
	}
	out := make([]Stored, n)
	var missing []string
	for i, r := range p.Rows {
		if st, ok := byID[r.ID]; ok {
			out[i] = st
			continue
		}
		if r.IdempotencyKey == nil {
			return nil, fmt.Errorf("event %s not returned", r.ID)
		}
		st, ok := byKey[*r.IdempotencyKey]
		if !ok {
			missing = append(missing, *r.IdempotencyKey)
			continue
		}
		st.Duplicate = true
		out[i] = st
	}
	if len(missing) == 0 {
		return out, nil
	}
	stored, err := d.ReadStored(ctx, ex, p.Table, missing)
	if err != nil {
		return nil, fmt.Errorf("read stored events: %w", err)
	}
	for _, st := range stored {
		if st.IdempotencyKey != nil {
			byKey[*st.IdempotencyKey] = st
		}
	}
	for i, r := range p.Rows {
		if out[i].Sequence != 0 {
			continue
		}
		st, ok := byKey[*r.IdempotencyKey]
		if !ok {
			return nil, fmt.Errorf("idempotency key %q neither inserted nor found", *r.IdempotencyKey)
		}
		st.Duplicate = true
		out[i] = st
	}
	return out, nil
}

// inOrder reports whether got is already one inserted event per row, in rows' order (the
// common case: nothing was a duplicate and the statement returned in input order).
func inOrder(rows []InsertRow, got []Stored) bool {
	if len(got) != len(rows) {
		return false
	}
	for i := range got {
		if got[i].Duplicate || got[i].ID != rows[i].ID {
			return false
		}
	}
	return true
}

// resolveScoped is OnePerRow for a scoped table or a call with extra columns: every row not in
// byID is read again by (scope columns, key) with one ResolveScoped.
func resolveScoped(ctx context.Context, d Dialect, ex Executor, p *InsertParams, byID map[string]Stored) ([]Stored, error) {
	out := make([]Stored, len(p.Rows))
	var probes []Probe
	for i, r := range p.Rows {
		if st, ok := byID[r.ID]; ok {
			out[i] = st
			continue
		}
		if r.IdempotencyKey == nil {
			return nil, fmt.Errorf("event %s not returned", r.ID)
		}
		e, err := probeExtra(r.Extra)
		if err != nil {
			return nil, fmt.Errorf("row %d: extra columns: %w", i, err)
		}
		probes = append(probes, Probe{Index: i, Key: *r.IdempotencyKey, Extra: e})
	}
	if len(probes) == 0 {
		return out, nil
	}
	res, err := d.ResolveScoped(ctx, ex, p.Table, probes)
	if err != nil {
		return nil, fmt.Errorf("read stored events: %w", err)
	}
	found := make(map[int]bool, len(probes))
	var conflicts []int
	for _, r := range res {
		i := r.Index
		if i < 0 || i >= len(p.Rows) {
			return nil, fmt.Errorf("read stored events: row %d out of range", i)
		}
		found[i] = true
		if !r.Same {
			conflicts = append(conflicts, i)
			continue
		}
		st := r.Stored
		st.Duplicate = true
		out[i] = st
	}
	if len(conflicts) > 0 {
		slices.Sort(conflicts)
		i := conflicts[0]
		return nil, &IdempotencyConflict{Index: i, Key: *p.Rows[i].IdempotencyKey}
	}
	for _, pr := range probes {
		if !found[pr.Index] {
			return nil, fmt.Errorf("idempotency key %q neither inserted nor found", pr.Key)
		}
	}
	return out, nil
}

// probeExtra is a row's extra columns (a JSON object, or nil) as a probe's values: each value
// kept as the JSON text that was inserted, so that the probe compares the same digits and
// text.
func probeExtra(extra *string) (map[string]any, error) {
	e := map[string]any{}
	if extra == nil {
		return e, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(*extra), &raw); err != nil {
		return nil, err
	}
	for k, v := range raw {
		e[k] = v
	}
	return e, nil
}
