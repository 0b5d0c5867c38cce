package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
)

// finalStatuses are the finished indexes, in the order the commit script
// takes their keys.
var finalStatuses = store.FinalRunStatuses

// finishedIndex is the position of a final status in finalStatuses.
func finishedIndex(st store.RunStatus) int {
	for i, f := range finalStatuses {
		if f == st {
			return i
		}
	}
	return 0
}

// finishedMember is a run's member in its finished index.
func finishedMember(run *store.Run) string {
	ended := run.FinishedAt
	if ended.IsZero() {
		ended = run.UpdatedAt
	}
	return indexMember(ended, run.ID)
}

func (s *Store) finishedMetaKey() string { return s.p + "meta:finished" }

// buildFinishedIndex files the runs that ended before the finished indexes
// existed, once for the store: the first gateway to open it does it, while
// the others go on.
func (s *Store) buildFinishedIndex(ctx context.Context) error {
	claimed, err := s.client.SetNX(ctx, s.finishedMetaKey(), "building", 10*time.Minute).Result()
	if err != nil || !claimed {
		return err
	}
	err = s.scanIndex(ctx, s.runsKey(), "", func(members []string) (bool, error) {
		runs, err := s.readHeaders(ctx, members, nil)
		if err != nil {
			return false, err
		}
		_, err = s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for _, r := range runs {
				if r.err != nil || !r.Status.Final() {
					continue
				}
				m := finishedMember(r.Run)
				p.ZAdd(ctx, s.finishedKey(r.Status), goredis.Z{Member: m})
				p.HSet(ctx, s.runKey(r.ID), "f", m)
			}
			return nil
		})
		return true, err
	})
	if err != nil {
		_ = s.client.Del(context.WithoutCancel(ctx), s.finishedMetaKey()).Err()
		return fmt.Errorf("indexing the runs that ended: %w", err)
	}
	return s.client.Set(ctx, s.finishedMetaKey(), "done", 0).Err()
}

// FinishedRuns implements store.Store.
func (s *Store) FinishedRuns(ctx context.Context, status store.RunStatus, fn func(*store.Run) (bool, error)) error {
	if !status.Final() || finalStatuses[finishedIndex(status)] != status {
		return fmt.Errorf("listing finished runs: status %q is not a final one: %w", status, store.ErrInvalid)
	}
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	err := s.scanIndex(ctx, s.finishedKey(status), "", func(members []string) (bool, error) {
		runs, err := s.readHeaders(ctx, members, nil)
		if err != nil {
			return false, err
		}
		for _, r := range runs {
			if r.err != nil {
				continue // damaged: listed as such, never pruned
			}
			if more, err := fn(r.Run); err != nil || !more {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("listing finished runs: %w", err)
	}
	return nil
}

// DeleteRun implements store.Store. A run's keys go with UNLINK, which
// frees a large value (a million split items) off Redis's main thread, in
// one transaction with its index entries, on the condition that the run's
// hash did not change since it was read: a replay that reopened the run
// meanwhile makes the deletion fail rather than take a running run.
func (s *Store) DeleteRun(ctx context.Context, id string) (store.Freed, error) {
	if err := s.begin(); err != nil {
		return store.Freed{}, err
	}
	defer s.end()
	keys := []string{s.runKey(id), s.stepKeysKey(id), s.stepsKey(id), s.eventsKey(id), s.leaseKey(id), s.fenceKey(id)}
	var freed store.Freed
	err := s.client.Watch(ctx, func(tx *goredis.Tx) error {
		vals, err := tx.HMGet(ctx, s.runKey(id), "h", "f").Result()
		if err != nil {
			return err
		}
		run, err := s.decodeRun(id, vals[:1])
		if errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err == nil && !run.Status.Final() {
			return fmt.Errorf("deleting run %s: it is %s: %w", id, run.Status, store.ErrUnfinished)
		}
		sizes := make([]*goredis.IntCmd, len(keys))
		if _, err := tx.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, k := range keys {
				sizes[i] = p.MemoryUsage(ctx, k)
			}
			return nil
		}); err != nil && !errors.Is(err, goredis.Nil) {
			return err
		}
		var unlinked *goredis.IntCmd
		_, err = tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			unlinked = p.Unlink(ctx, keys...)
			p.ZRem(ctx, s.unfinishedKey(), id)
			if run != nil {
				p.ZRem(ctx, s.runsKey(), indexMember(run.CreatedAt, run.ID))
			}
			if f, ok := vals[1].(string); ok {
				for _, st := range finalStatuses {
					p.ZRem(ctx, s.finishedKey(st), f)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		freed.Records = int(unlinked.Val())
		for _, c := range sizes {
			freed.Bytes += c.Val()
		}
		if run == nil {
			// A damaged record: its listing entry is found by its id.
			return s.deleteIndexEntry(ctx, id)
		}
		return nil
	}, s.runKey(id))
	switch {
	case errors.Is(err, goredis.TxFailedErr):
		return freed, fmt.Errorf("deleting run %s: it changed while being deleted (a replay?): %w", id, store.ErrConflict)
	case err != nil:
		return freed, fmt.Errorf("deleting run %s: %w", id, err)
	}
	return freed, nil
}

// deleteIndexEntry removes a run's entry from the listing index when its
// record could not say when it was created.
func (s *Store) deleteIndexEntry(ctx context.Context, id string) error {
	var found string
	err := s.scanIndex(ctx, s.runsKey(), "", func(members []string) (bool, error) {
		for _, m := range members {
			if len(m) > 16 && m[16:] == id {
				found = m
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil || found == "" {
		return err
	}
	return s.client.ZRem(ctx, s.runsKey(), found).Err()
}
