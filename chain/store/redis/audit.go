package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

func (s *Store) auditKey() string    { return s.p + "audit" }
func (s *Store) auditIDsKey() string { return s.p + "auditids" }

// AppendAudit implements store.Store.
func (s *Store) AppendAudit(ctx context.Context, e *store.AuditEntry) error {
	if err := store.CheckAudit(e); err != nil {
		return err
	}
	v, err := jsonx.Marshal(e)
	if err != nil {
		return fmt.Errorf("encoding audit entry %s: %w", e.ID, err)
	}
	return s.putIndexed(ctx, s.auditKey(), s.auditIDsKey(), e.ID, v)
}

// WalkAudit implements store.Store, a page of ids at a time.
func (s *Store) WalkAudit(ctx context.Context, scan store.AuditScan, fn func(*store.AuditEntry) (bool, error)) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	lo, hi := scan.Bounds()
	min, max := "-", "+"
	if lo != "" {
		min = "[" + lo
	}
	if hi != "" {
		max = "(" + hi
	}
	for {
		by := &goredis.ZRangeBy{Min: min, Max: max, Count: pageSize}
		var ids []string
		var err error
		if scan.Oldest {
			ids, err = s.client.ZRangeByLex(ctx, s.auditIDsKey(), by).Result()
		} else {
			ids, err = s.client.ZRevRangeByLex(ctx, s.auditIDsKey(), by).Result()
		}
		if err != nil {
			return fmt.Errorf("reading the audit log: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		vals, err := s.client.HMGet(ctx, s.auditKey(), ids...).Result()
		if err != nil {
			return fmt.Errorf("reading the audit log: %w", err)
		}
		for i, v := range vals {
			str, ok := v.(string)
			if !ok {
				continue // pruned since the ids were read
			}
			var e store.AuditEntry
			if err := jsonx.Unmarshal([]byte(str), &e); err != nil {
				return fmt.Errorf("decoding audit entry %s (key %s): %w", ids[i], s.auditKey(), err)
			}
			if more, err := fn(&e); err != nil || !more {
				return err
			}
		}
		if len(ids) < pageSize {
			return nil
		}
		if scan.Oldest {
			min = "(" + ids[len(ids)-1]
		} else {
			max = "(" + ids[len(ids)-1]
		}
	}
}

// PruneAudit implements store.Store, a page of ids at a time.
func (s *Store) PruneAudit(ctx context.Context, before time.Time) (int, error) {
	if err := s.begin(); err != nil {
		return 0, err
	}
	defer s.end()
	max := "(" + store.IDFloor(before)
	total := 0
	for {
		ids, err := s.client.ZRangeByLex(ctx, s.auditIDsKey(), &goredis.ZRangeBy{Min: "-", Max: max, Count: pageSize}).Result()
		if err != nil {
			return total, fmt.Errorf("pruning the audit log: %w", err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		members := make([]any, len(ids))
		for i, id := range ids {
			members[i] = id
		}
		if _, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			p.HDel(ctx, s.auditKey(), ids...)
			p.ZRem(ctx, s.auditIDsKey(), members...)
			return nil
		}); err != nil {
			return total, fmt.Errorf("pruning the audit log: %w", err)
		}
		total += len(ids)
	}
}
