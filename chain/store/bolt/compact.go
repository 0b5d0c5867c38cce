package bolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/chaingate/gateway/chain/store"
)

// openCurrent opens the file path names, as bbolt.Open does, and makes sure
// that it is still the file path names once its lock is held: a compaction
// or a restore renames a new file over the old one while holding the old
// one's lock, and a gateway that opened the old one and waited for its
// lock must open the new one instead.
func openCurrent(path string, o *bbolt.Options) (*bbolt.DB, error) {
	for range 3 {
		before, _ := os.Stat(path)
		db, err := bbolt.Open(path, 0o600, o)
		if err != nil {
			return nil, err
		}
		after, err := os.Stat(path)
		if err != nil {
			_ = db.Close()
			return nil, err
		}
		if before == nil || os.SameFile(before, after) {
			return db, nil
		}
		if err := db.Close(); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("opening %s: the file was replaced three times while this process waited for its lock", path)
}

// CompactInfo says what a compaction did.
type CompactInfo struct {
	// Before and After are the file's sizes in bytes.
	Before, After int64
}

// compactTxBytes is how much one transaction of a compaction writes: the
// copy commits as it goes rather than holding the whole store in one.
const compactTxBytes = 64 << 20

// Compact rewrites the store file at path without its free pages: bbolt
// reuses the pages that deleted records free, but never gives them back to
// the file system. The file must be the process's alone (a gateway holding
// it is refused with store.ErrInUse after lockTimeout); its lock is held
// throughout. The copy is written beside it as PATH.compact-tmp, synced,
// checked, and renamed over it: interrupted, it leaves the file as it was.
func Compact(ctx context.Context, path string, lockTimeout time.Duration) (CompactInfo, error) {
	fail := func(err error) (CompactInfo, error) {
		return CompactInfo{}, fmt.Errorf("compacting store %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return fail(err)
	}
	if st.IsDir() || st.Size() == 0 {
		return fail(errors.New("it holds no store"))
	}
	src, err := openCurrent(path, &bbolt.Options{Timeout: lockTimeoutOr(lockTimeout), FreelistType: bbolt.FreelistMapType})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return fail(fmt.Errorf("%w: a gateway is running on it; stop it first, as compaction needs the file to itself", store.ErrInUse))
	}
	if err != nil {
		return fail(err)
	}
	defer src.Close()
	var srcFormat string
	err = src.View(func(tx *bbolt.Tx) error {
		var err error
		srcFormat, err = checkFormat(tx)
		if err == nil && srcFormat == "" {
			err = errors.New("it holds no store")
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	tmp := path + ".compact-tmp"
	// Left by a compaction that was interrupted; the lock says none runs.
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	done := false
	defer func() {
		if !done {
			_ = os.Remove(tmp)
		}
	}()
	// Mapped as it grows, so that the file grows with what is written: a
	// larger mapping makes bbolt grow the file 16 MB at a time.
	dst, err := bbolt.Open(tmp, 0o600, &bbolt.Options{NoSync: true, FreelistType: bbolt.FreelistMapType})
	if err != nil {
		return fail(err)
	}
	copied, err := copyDB(ctx, dst, src)
	var used int64
	if err == nil {
		err = dst.View(func(tx *bbolt.Tx) error {
			used = tx.Size()
			return nil
		})
	}
	if err = errors.Join(err, dst.Close()); err != nil {
		return fail(err)
	}
	// bbolt grows a file 16 MB ahead of what it holds; the copy ends
	// where its last page does, and grows again when it is written to.
	if err := truncateSync(tmp, used); err != nil {
		return fail(err)
	}
	if err := checkCopy(tmp, srcFormat, copied); err != nil {
		return fail(fmt.Errorf("checking the compacted copy: %w", err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	done = true
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fail(err)
	}
	after, err := os.Stat(path)
	if err != nil {
		return fail(err)
	}
	return CompactInfo{Before: st.Size(), After: after.Size()}, nil
}

func truncateSync(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return errors.Join(f.Truncate(size), f.Sync(), f.Close())
}

// copyDB copies every bucket and key of src into dst, committing every
// compactTxBytes, and returns how many keys it copied.
func copyDB(ctx context.Context, dst, src *bbolt.DB) (int, error) {
	w := &txWriter{db: dst}
	defer w.rollback()
	err := src.View(func(tx *bbolt.Tx) error {
		read := mappedRead{tx: tx}
		defer read.done()
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			return copyBucket(ctx, w, &read, [][]byte{name}, b)
		})
	})
	if err != nil {
		return 0, err
	}
	return w.keys, w.commit()
}

func copyBucket(ctx context.Context, w *txWriter, read *mappedRead, path [][]byte, b *bbolt.Bucket) error {
	if err := w.create(path, b.Sequence()); err != nil {
		return err
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if v == nil {
			if err := copyBucket(ctx, w, read, append(path[:len(path):len(path)], k), b.Bucket(k)); err != nil {
				return err
			}
			continue
		}
		if err := w.put(path, k, v); err != nil {
			return err
		}
		read.note(len(k) + len(v))
	}
	return nil
}

// txWriter writes a copy in transactions of about compactTxBytes. The keys
// and values it puts are the source's, which stay valid while the source's
// read transaction lasts.
type txWriter struct {
	db   *bbolt.DB
	tx   *bbolt.Tx
	size int
	keys int
}

func (w *txWriter) begin() error {
	if w.tx != nil {
		return nil
	}
	var err error
	w.tx, err = w.db.Begin(true)
	return err
}

func (w *txWriter) bucket(path [][]byte) *bbolt.Bucket {
	b := w.tx.Bucket(path[0])
	for _, name := range path[1:] {
		b = b.Bucket(name)
	}
	// Every page full: a compacted file is as small as it can be.
	b.FillPercent = 1.0
	return b
}

func (w *txWriter) create(path [][]byte, seq uint64) error {
	if err := w.begin(); err != nil {
		return err
	}
	var b *bbolt.Bucket
	var err error
	if len(path) == 1 {
		b, err = w.tx.CreateBucket(path[0])
	} else {
		b, err = w.bucket(path[:len(path)-1]).CreateBucket(path[len(path)-1])
	}
	if err != nil {
		return err
	}
	return b.SetSequence(seq)
}

func (w *txWriter) put(path [][]byte, k, v []byte) error {
	if w.size >= compactTxBytes {
		if err := w.commit(); err != nil {
			return err
		}
	}
	if err := w.begin(); err != nil {
		return err
	}
	w.size += len(k) + len(v)
	w.keys++
	return w.bucket(path).Put(k, v)
}

func (w *txWriter) commit() error {
	if w.tx == nil {
		return nil
	}
	err := w.tx.Commit()
	w.tx, w.size = nil, 0
	return err
}

func (w *txWriter) rollback() {
	if w.tx != nil {
		_ = w.tx.Rollback()
		w.tx = nil
	}
}

// checkCopy opens a compacted copy and checks its format and that it holds
// as many keys as were copied.
func checkCopy(path, wantFormat string, keys int) error {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		f, err := checkFormat(tx)
		if err != nil {
			return err
		}
		if f != wantFormat {
			return fmt.Errorf("it is in format %q, the store in %q", f, wantFormat)
		}
		n := 0
		err = tx.ForEach(func(_ []byte, b *bbolt.Bucket) error {
			n += b.Stats().KeyN
			return nil
		})
		if err == nil && n != keys {
			err = fmt.Errorf("it holds %d keys of the %d copied", n, keys)
		}
		return err
	})
}
