package bolt

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// bucketAudit holds the audit log: entry id (sorting by time) → entry.
var bucketAudit = []byte("audit")

// AppendAudit implements store.Store. An entry shares the transaction, and
// the fsync, of the commits waiting with it.
func (s *Store) AppendAudit(ctx context.Context, e *store.AuditEntry) error {
	if err := store.CheckAudit(e); err != nil {
		return err
	}
	v, err := jsonx.Marshal(e)
	if err != nil {
		return fmt.Errorf("encoding audit entry %s: %w", e.ID, err)
	}
	return s.writeShared(ctx, "appending audit entry "+e.ID, func(tx *bbolt.Tx) error { return tx.Bucket(bucketAudit).Put([]byte(e.ID), v) })
}

// auditPage is how many entries a walk reads in one read transaction: a
// slow reader of a long log holds no transaction open for long.
const auditPage = 256

// WalkAudit implements store.Store.
func (s *Store) WalkAudit(ctx context.Context, scan store.AuditScan, fn func(*store.AuditEntry) (bool, error)) error {
	lo, hi := scan.Bounds()
	for {
		var page []*store.AuditEntry
		err := s.view(func(tx *bbolt.Tx) error {
			c := tx.Bucket(bucketAudit).Cursor()
			var k, v []byte
			next := c.Next
			if scan.Oldest {
				k, v = c.Seek([]byte(lo))
			} else {
				next = c.Prev
				if hi == "" {
					k, v = c.Last()
				} else if k, v = c.Seek([]byte(hi)); k == nil {
					k, v = c.Last()
				} else {
					k, v = c.Prev()
				}
			}
			for ; k != nil && len(page) < auditPage; k, v = next() {
				if (hi != "" && bytes.Compare(k, []byte(hi)) >= 0) || bytes.Compare(k, []byte(lo)) < 0 {
					break
				}
				var e store.AuditEntry
				if err := jsonx.Unmarshal(v, &e); err != nil {
					return fmt.Errorf("decoding audit entry %s: %w", k, err)
				}
				page = append(page, &e)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, e := range page {
			if more, err := fn(e); err != nil || !more {
				return err
			}
		}
		if len(page) < auditPage {
			return nil
		}
		last := page[len(page)-1].ID
		if scan.Oldest {
			lo = last + "\x00"
		} else {
			hi = last
		}
	}
}

// PruneAudit implements store.Store, a few thousand entries a transaction.
func (s *Store) PruneAudit(ctx context.Context, before time.Time) (int, error) {
	floor := []byte(store.IDFloor(before))
	total := 0
	for {
		n := 0
		err := s.batch(func(tx *bbolt.Tx) error {
			n = 0
			c := tx.Bucket(bucketAudit).Cursor()
			for k, _ := c.First(); k != nil && bytes.Compare(k, floor) < 0 && n < 4096; k, _ = c.First() {
				if err := c.Delete(); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		total += n
		if err != nil {
			return total, fmt.Errorf("pruning the audit log: %w", err)
		}
		if n < 4096 || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
