package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain/store"
)

// ErrItemsUnknown says a split's items cannot be rendered again here: the
// split sits inside another split's item.
var ErrItemsUnknown = errors.New("the items of a split inside another split's item are not rendered again")

// SplitItemValues renders a top-level split's items again, from the run's
// origin and the results its steps recorded, as the split rendered them, and
// returns those at the given indexes as JSON. A split keeps no copy of its
// items: they are what its items template makes of the run.
func (e *Engine) SplitItemValues(ctx context.Context, runID, split string, indexes []int) (map[int]json.RawMessage, error) {
	if strings.ContainsAny(split, "/[") {
		return nil, ErrItemsUnknown
	}
	run, err := e.store.Run(ctx, runID)
	if err != nil {
		return nil, err
	}
	def, cfg, err := e.definition(ctx, run.Chain, run.ChainHash)
	if err != nil {
		return nil, err
	}
	s := def.Step(split)
	if s == nil || s.Split == nil || s.Parent != nil {
		return nil, fmt.Errorf("%w: chain %q has no top-level split %q", store.ErrNotFound, run.Chain, split)
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
	if i := slices.Index(r.top.path, split); i >= 0 {
		r.top.path = r.top.path[:i]
	}
	items, errInfo := r.renderItems(s, r.scopeOf(r.top))
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
