package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// Retention's buckets: finished runs by status and the time they ended, so
// that the runs to prune are found without reading the others; which of
// those entries is each run's, to move it when a replayed run ends again;
// and the runs being deleted, whose records go in pieces.
var (
	bucketFinished   = []byte("finished")        // status | ended-at | id → nothing
	bucketFinishedBy = []byte("finished_by_run") // id → its key in finished
	bucketDeleting   = []byte("deleting")        // id → nothing
	// finishedIndexKey in the meta bucket says the finished index holds
	// every run that ended, those ended before it existed included.
	finishedIndexKey = []byte("finished_index")
)

// deleteChunk bounds how many of a run's records one transaction deletes:
// a run's records go in many short transactions, so the commits of live
// runs wait for one of them at most.
const deleteChunk = 512

// deletePause is the breath between two of those transactions.
const deletePause = time.Millisecond

// statusCodes name a final status in finished-index keys.
var statusCodes = map[store.RunStatus]byte{
	store.RunSucceeded: 's', store.RunFailed: 'f', store.RunCancelled: 'c', store.RunTimedOut: 't', store.RunSkipped: 'k',
}

// finishedKey is a run's entry in the finished index.
func finishedKey(run *store.Run) []byte {
	ended := run.FinishedAt
	if ended.IsZero() {
		ended = run.UpdatedAt
	}
	b := make([]byte, 0, 9+len(run.ID))
	b = append(b, statusCodes[run.Status])
	b = binary.BigEndian.AppendUint64(b, uint64(ended.UnixNano()))
	return append(b, run.ID...)
}

// indexFinished files a run that has ended in the finished index, moving
// its entry if it ended before (a replayed run ending again).
func indexFinished(tx *bbolt.Tx, run *store.Run) error {
	key := finishedKey(run)
	by := tx.Bucket(bucketFinishedBy)
	old := by.Get([]byte(run.ID))
	if bytes.Equal(old, key) {
		return nil
	}
	finished := tx.Bucket(bucketFinished)
	if old != nil {
		if err := finished.Delete(old); err != nil {
			return err
		}
	}
	if err := finished.Put(key, nil); err != nil {
		return err
	}
	return by.Put([]byte(run.ID), key)
}

// unindexFinished takes a run out of the finished index: it was replayed,
// or it is deleted.
func unindexFinished(tx *bbolt.Tx, id []byte) error {
	by := tx.Bucket(bucketFinishedBy)
	old := by.Get(id)
	if old == nil {
		return nil
	}
	if err := tx.Bucket(bucketFinished).Delete(old); err != nil {
		return err
	}
	return by.Delete(id)
}

// buildFinishedIndex files every run that ended before the index existed.
func buildFinishedIndex(tx *bbolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta.Get(finishedIndexKey) != nil {
		return nil
	}
	runs := tx.Bucket(bucketRuns)
	c := tx.Bucket(bucketRunIndex).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		var run store.Run
		if v := runs.Get(headerKey(string(k[8:]))); v == nil || jsonx.Unmarshal(v, &run) != nil || !run.Status.Final() {
			// A damaged record is listed as damaged, and never pruned.
			continue
		}
		if err := indexFinished(tx, &run); err != nil {
			return err
		}
	}
	return meta.Put(finishedIndexKey, []byte("1"))
}

// finishedPage is how many finished runs FinishedRuns reads per
// transaction: fn runs with no transaction open, so it may write.
const finishedPage = 256

// FinishedRuns implements store.Store.
func (s *Store) FinishedRuns(ctx context.Context, status store.RunStatus, fn func(*store.Run) (bool, error)) error {
	code, ok := statusCodes[status]
	if !ok {
		return fmt.Errorf("listing finished runs: status %q is not a final one: %w", status, store.ErrInvalid)
	}
	seek := []byte{code}
	for seek != nil {
		var page []*store.Run
		var next []byte // the first entry of the next page; nil at the end
		err := s.view(func(tx *bbolt.Tx) error {
			c := tx.Bucket(bucketFinished).Cursor()
			for k, _ := c.Seek(seek); k != nil && k[0] == code; k, _ = c.Next() {
				if len(page) == finishedPage {
					next = append([]byte(nil), k...)
					return nil
				}
				run, err := readHeader(tx, string(k[9:]))
				if errors.Is(err, store.ErrDamaged) || errors.Is(err, store.ErrNotFound) {
					continue
				}
				if err != nil {
					return err
				}
				page = append(page, run)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("listing finished runs: %w", err)
		}
		for _, run := range page {
			if err := ctx.Err(); err != nil {
				return err
			}
			if more, err := fn(run); err != nil || !more {
				return err
			}
		}
		seek = next
	}
	return nil
}

// DeleteRun implements store.Store. The run leaves every index and its
// record at once, in one transaction; its step records and events follow
// in transactions of deleteChunk records, which a gateway that stops
// midway finishes when it opens the file again.
func (s *Store) DeleteRun(ctx context.Context, id string) (store.Freed, error) {
	var freed store.Freed
	err := s.update(func(tx *bbolt.Tx) error {
		freed = store.Freed{}
		key, hk := []byte(id), headerKey(id)
		runs := tx.Bucket(bucketRuns)
		h := runs.Get(hk)
		if h == nil {
			return fmt.Errorf("run %s: %w", id, store.ErrNotFound)
		}
		var run store.Run
		if err := jsonx.Unmarshal(h, &run); err == nil && !run.Status.Final() {
			return fmt.Errorf("deleting run %s: it is %s: %w", id, run.Status, store.ErrUnfinished)
		} else if err == nil {
			if err := tx.Bucket(bucketRunIndex).Delete(indexKey(run.CreatedAt, run.ID)); err != nil {
				return err
			}
		}
		// A damaged record's index entry is found by its id.
		if err := deleteIndexEntry(tx, id); err != nil {
			return err
		}
		freed.Records, freed.Bytes = 1, int64(len(hk)+len(h))
		origins := tx.Bucket(bucketOrigins)
		for _, k := range [][]byte{key, apartKey(key)} {
			if v := origins.Get(k); v != nil {
				freed.Records++
				freed.Bytes += int64(len(k) + len(v))
				if err := origins.Delete(k); err != nil {
					return err
				}
			}
		}
		if err := errors.Join(runs.Delete(hk), tx.Bucket(bucketUnfinished).Delete(key), unindexFinished(tx, key)); err != nil {
			return err
		}
		return tx.Bucket(bucketDeleting).Put(key, nil)
	})
	if err != nil {
		return freed, err
	}
	rest, err := s.purgeRecords(ctx, id)
	freed.Add(rest)
	if err != nil {
		return freed, fmt.Errorf("deleting the records of run %s: %w", id, err)
	}
	return freed, nil
}

// deleteIndexEntry removes a run's entry from the listing index when its
// record could not say when it was created.
func deleteIndexEntry(tx *bbolt.Tx, id string) error {
	c := tx.Bucket(bucketRunIndex).Cursor()
	for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
		if string(k[8:]) == id {
			return c.Delete()
		}
	}
	return nil
}

// purgeRecords deletes a deleted run's step records and events, a chunk
// at a time through the writer, and then its mark in the deleting bucket.
func (s *Store) purgeRecords(ctx context.Context, id string) (store.Freed, error) {
	var freed store.Freed
	for {
		req := &commitReq{purge: id, done: make(chan error, 1)}
		err := s.submit(ctx, req)
		freed.Add(req.purged)
		if err != nil || req.purgedAll {
			return freed, err
		}
		select {
		case <-ctx.Done():
			return freed, ctx.Err()
		case <-time.After(deletePause):
		}
	}
}

// purgeChunk deletes up to deleteChunk records of a deleted run, and its
// mark once none is left.
func purgeChunk(tx *bbolt.Tx, r *commitReq) error {
	prefix := runKey(r.purge, 0, nil)[:len(r.purge)+1]
	c := tx.Bucket(bucketRuns).Cursor()
	k, v := c.Seek(prefix)
	for ; k != nil && bytes.HasPrefix(k, prefix) && r.purged.Records < deleteChunk; k, v = c.Seek(prefix) {
		r.purged.Records++
		r.purged.Bytes += int64(len(k) + len(v))
		if err := c.Delete(); err != nil {
			return err
		}
	}
	if k == nil || !bytes.HasPrefix(k, prefix) {
		r.purgedAll = true
		return tx.Bucket(bucketDeleting).Delete([]byte(r.purge))
	}
	return nil
}

// finishDeletes purges the records of runs whose deletion a gateway began
// and did not finish, before it stopped.
func (s *Store) finishDeletes(ctx context.Context) {
	var ids []string
	_ = s.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketDeleting).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	for _, id := range ids {
		if _, err := s.purgeRecords(ctx, id); err != nil && !errors.Is(err, store.ErrClosed) && ctx.Err() == nil {
			s.log.Error("finishing the deletion of a run's records", "run", id, "err", err)
		}
	}
}

// update runs fn in a write transaction of its own.
func (s *Store) update(fn func(tx *bbolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	return s.db.Update(fn)
}
