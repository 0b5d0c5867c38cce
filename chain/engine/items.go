package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/templates"
)

// SplitItemValues renders a split's items again, from the run's origin and
// the results its steps recorded, as the split rendered them, and returns
// those at the given indexes as JSON. A split keeps no copy of its items:
// they are what its items template makes of the run. A split inside another
// split's item (its key such as "hosts[03]/ports") is rendered in that
// item's scope: the enclosing items' values and the steps each ran before.
func (e *Engine) SplitItemValues(ctx context.Context, runID, split string, indexes []int) (map[int]json.RawMessage, error) {
	levels, name, err := parseSplitKey(split)
	if err != nil {
		return nil, err
	}
	run, err := e.store.Run(ctx, runID)
	if err != nil {
		return nil, err
	}
	def, cfg, err := e.definition(ctx, run.Chain, run.ChainHash)
	if err != nil {
		return nil, err
	}
	s := def.Step(name)
	if s == nil || s.Split == nil || !enclosedBy(s, levels) {
		return nil, fmt.Errorf("%w: chain %q has no split %q", store.ErrNotFound, run.Chain, split)
	}
	var recs []*store.StepRecord
	err = e.store.ForEachStep(ctx, runID, store.StepScan{SkipItems: true}, func(rec *store.StepRecord) error {
		recs = append(recs, rec)
		return nil
	})
	if err != nil {
		return nil, err
	}
	r := e.newRunner(def, cfg, run, recs)
	// prev is what it was when the split started: the step before it.
	first := name
	if len(levels) > 0 {
		first = levels[0].split
	}
	if i := slices.Index(r.top.path, first); i >= 0 {
		r.top.path = r.top.path[:i]
	}
	owner := r.top
	for k, lv := range levels {
		next := name
		if k+1 < len(levels) {
			next = levels[k+1].split
		}
		if owner, err = e.itemScope(ctx, r, runID, owner, def.Step(lv.split), lv, next); err != nil {
			return nil, err
		}
	}
	items, errInfo := r.renderItems(s, r.scopeOf(owner))
	if errInfo != nil {
		return nil, fmt.Errorf("rendering the items of split %q again: %s", split, errInfo.Message)
	}
	out := make(map[int]json.RawMessage, len(indexes))
	for _, i := range indexes {
		if i >= 0 && i < items.Len() {
			if b, err := items.JSON(i); err == nil {
				out[i] = b
			}
		}
	}
	return out, nil
}

// itemLevel is one enclosing item in a split's key: "hosts[03]/".
type itemLevel struct {
	split  string
	index  int
	prefix string // the key up to and including this level
}

// parseSplitKey reads a split's record key into the items enclosing it and
// its step's name.
func parseSplitKey(key string) ([]itemLevel, string, error) {
	var levels []itemLevel
	rest := key
	for {
		head, tail, nested := strings.Cut(rest, "]/")
		if !nested {
			break
		}
		name, idx, ok := strings.Cut(head, "[")
		i, err := strconv.Atoi(idx)
		if !ok || err != nil || name == "" || strings.ContainsAny(name, "[]/") {
			return nil, "", fmt.Errorf("%w: %q is not a split's key", store.ErrNotFound, key)
		}
		levels = append(levels, itemLevel{split: name, index: i, prefix: key[:len(key)-len(tail)]})
		rest = tail
	}
	if rest == "" || strings.ContainsAny(rest, "[]/") {
		return nil, "", fmt.Errorf("%w: %q is not a split's key", store.ErrNotFound, key)
	}
	return levels, rest, nil
}

// enclosedBy reports whether the splits enclosing s, outermost first, are
// the levels'.
func enclosedBy(s *chain.Step, levels []itemLevel) bool {
	var outer []string
	for p := s.Parent; p != nil; p = p.Parent {
		if p.Split == nil {
			return false // a parallel group's sub-step is never a split
		}
		outer = append(outer, p.Name)
	}
	if len(outer) != len(levels) {
		return false
	}
	for i, lv := range levels {
		if outer[len(outer)-1-i] != lv.split {
			return false
		}
	}
	return true
}

// itemScope rebuilds, for rendering again, the list of an item of split sp
// (held by owner) as it stood when the item reached step next: the item's
// value, its steps' results over those of the lists enclosing it, and the
// step it ran before next.
func (e *Engine) itemScope(ctx context.Context, r *runner, runID string, owner *seq, sp *chain.Step, lv itemLevel, next string) (*seq, error) {
	items, errInfo := r.renderItems(sp, r.scopeOf(owner))
	if errInfo != nil {
		return nil, fmt.Errorf("rendering the items of split %q again: %s", strings.TrimSuffix(lv.prefix, "/"), errInfo.Message)
	}
	if lv.index < 0 || lv.index >= items.Len() {
		return nil, fmt.Errorf("%w: split %q has no item %d", store.ErrNotFound, sp.Name, lv.index)
	}
	q := &seq{
		steps:   sp.Split.Steps,
		prefix:  lv.prefix,
		vars:    maps.Clone(owner.vars),
		split:   &split{step: sp, key: owner.prefix + sp.Name, owner: owner, total: items.Len()},
		index:   lv.index,
		item:    items.At(lv.index),
		lineage: append(slices.Clone(owner.lineage), Frame{Split: sp.Name, Index: lv.index, Total: items.Len()}),
	}
	var mine []*store.StepRecord
	var nextRec *store.StepRecord
	err := e.store.ForEachStep(ctx, runID, store.StepScan{Prefix: lv.prefix}, func(rec *store.StepRecord) error {
		if !visibleFrom(rec.Key, []string{lv.prefix}) {
			return nil
		}
		q.vars[rec.Name] = stepValue(rec, r.bodyValue(rec))
		if rec.Key == lv.prefix+next {
			nextRec = rec
		} else if !strings.Contains(rec.Key[len(lv.prefix):], "/") {
			mine = append(mine, rec)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The item's steps ran one after another: the one before next is the
	// last to finish before next started.
	var prev *store.StepRecord
	for _, rec := range mine {
		if rec.FinishedAt.IsZero() || (nextRec != nil && rec.FinishedAt.After(nextRec.StartedAt)) {
			continue
		}
		if prev == nil || rec.FinishedAt.After(prev.FinishedAt) {
			prev = rec
		}
	}
	if prev != nil {
		q.path = []string{prev.Name}
	}
	return q, nil
}

// ItemValue is item i of the split splitKey of a run this engine advances,
// as its steps read it (item); ok is false when the run or split is not
// here. It asks the run's goroutine, so it must not be called from it.
func (e *Engine) ItemValue(ctx context.Context, runID, splitKey string, i int) (any, bool) {
	r := e.active(runID)
	if r == nil {
		return nil, false
	}
	var v any
	var ok bool
	done := make(chan struct{})
	if !r.give(outcome{do: func(r *runner) {
		defer close(done)
		if sp := r.splits[splitKey]; sp != nil && i >= 0 && i < sp.total {
			v, ok = sp.place.value(i), true
			if l, lazy := v.(templates.Lazy); lazy {
				v = l.Value()
			}
		}
	}}, ctx) {
		return nil, false
	}
	select {
	case <-done:
		return v, ok
	case <-r.done:
	case <-ctx.Done():
	}
	return nil, false
}
