package bolt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
)

// Kind names this store in a backup's header.
const Kind = "bolt"

// tagFile is the frames of a backup that hold the bbolt file.
const tagFile = 'D'

var _ store.Snapshotter = (*Store)(nil)

// Snapshot implements store.Snapshotter: the file as one read transaction
// sees it, which bbolt writes out page by page from the file itself, not
// through the mapping. The transaction holds the pages it reads, so the
// file cannot reuse the pages commits free meanwhile: a backup under heavy
// writes grows the file by what they write while it lasts.
func (s *Store) Snapshot(ctx context.Context, w io.Writer) (store.SnapshotInfo, error) {
	var info store.SnapshotInfo
	err := s.view(func(tx *bbolt.Tx) error {
		var err error
		info, err = writeSnapshot(ctx, tx, w)
		return err
	})
	return info, err
}

// SnapshotFile writes a backup of the store file at path, which no gateway
// may hold: it takes the file's lock, shared, for as long as it reads, so
// a gateway cannot start on the file meanwhile. A file a gateway holds is
// refused with store.ErrInUse after lockTimeout.
func SnapshotFile(ctx context.Context, path string, w io.Writer, lockTimeout time.Duration) (store.SnapshotInfo, error) {
	if _, err := os.Stat(path); err != nil {
		return store.SnapshotInfo{}, fmt.Errorf("backing up store %s: %w", path, err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: lockTimeoutOr(lockTimeout)})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return store.SnapshotInfo{}, fmt.Errorf("backing up store %s: %w: a gateway is running on it; take the backup through it (gateway backup --server URL)", path, store.ErrInUse)
	}
	if err != nil {
		return store.SnapshotInfo{}, fmt.Errorf("backing up store %s: %w", path, err)
	}
	defer db.Close()
	var info store.SnapshotInfo
	err = db.View(func(tx *bbolt.Tx) error {
		var err error
		info, err = writeSnapshot(ctx, tx, w)
		return err
	})
	if err != nil {
		return store.SnapshotInfo{}, fmt.Errorf("backing up store %s: %w", path, err)
	}
	return info, nil
}

func lockTimeoutOr(d time.Duration) time.Duration {
	if d <= 0 {
		return 500 * time.Millisecond
	}
	return d
}

// writeSnapshot writes the backup of what tx sees.
func writeSnapshot(ctx context.Context, tx *bbolt.Tx, w io.Writer) (store.SnapshotInfo, error) {
	f, err := checkFormat(tx)
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	if f == "" {
		return store.SnapshotInfo{}, errors.New("the file holds no store")
	}
	info := store.SnapshotInfo{Kind: Kind, Runs: countKeys(tx, bucketRunIndex), Unfinished: countKeys(tx, bucketUnfinished)}
	bw, err := backup.NewWriter(w, backup.Header{Kind: Kind, Format: f, Created: time.Now().UTC(), Source: tx.DB().Path()})
	if err != nil {
		return info, err
	}
	cw := bw.Chunks(tagFile)
	if _, err := tx.WriteTo(ctxWriter{ctx: ctx, w: cw}); err != nil {
		return info, fmt.Errorf("copying the file: %w", err)
	}
	if err := cw.Flush(); err != nil {
		return info, err
	}
	return info, bw.Close(backup.Trailer{Runs: info.Runs})
}

func countKeys(tx *bbolt.Tx, bucket []byte) int {
	if b := tx.Bucket(bucket); b != nil {
		return b.Stats().KeyN
	}
	return 0
}

// ctxWriter stops a long copy once ctx ends.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// Restore writes the store a backup holds to path, which must not hold
// one with anything in it, and no gateway may hold. The file is written
// beside path under another name, checked (whole, and in a format this
// gateway reads), and only then renamed to path: a backup cut short or
// damaged leaves nothing behind.
func Restore(ctx context.Context, r *backup.Reader, path string) (store.SnapshotInfo, error) {
	fail := func(err error) (store.SnapshotInfo, error) {
		return store.SnapshotInfo{}, fmt.Errorf("restoring into %s: %w", path, err)
	}
	h := r.Header()
	if h.Kind != Kind {
		return fail(fmt.Errorf("the backup holds a %s store, not a bolt file", h.Kind))
	}
	if h.Format != format && !slices.Contains(movedFormats, h.Format) {
		return fail(fmt.Errorf("the backup holds a store in format %s, and this gateway reads %s: restore it with the gateway version that took it", h.Format, readFormats()))
	}
	old, err := claimEmpty(path)
	if err != nil {
		return fail(err)
	}
	if old != nil {
		// Held until the new file is in place, so no gateway opens the
		// old one meanwhile (openCurrent).
		defer old.Close()
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fail(err)
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".restore-*")
	if err != nil {
		return fail(err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	var size int64
	for {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		tag, p, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(err)
		}
		if tag != tagFile {
			return fail(fmt.Errorf("%w: a frame of kind %q in a bolt backup", backup.ErrDamaged, tag))
		}
		n, err := tmp.Write(p)
		size += int64(n)
		if err != nil {
			return fail(err)
		}
	}
	if size == 0 {
		// bbolt would take the empty file for a new store, and fail to
		// write one into a file opened to be read.
		return fail(fmt.Errorf("%w: it holds no store file: nothing comes between its header and its end frame, and a backup of a store always holds its file; take the backup again", backup.ErrDamaged))
	}
	if err := errors.Join(tmp.Sync(), tmp.Close()); err != nil {
		return fail(err)
	}
	info, err := checkFile(tmp.Name())
	if err != nil {
		return fail(fmt.Errorf("checking the restored file: %w", err))
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fail(err)
	}
	done = true
	if err := syncDir(dir); err != nil {
		return fail(err)
	}
	return info, nil
}

// claimEmpty checks that path holds no store with anything in it, and
// returns the store that is there, empty, open and locked; nil when there
// is none.
func claimEmpty(path string) (*bbolt.DB, error) {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, err
	case st.IsDir():
		return nil, fmt.Errorf("%s is a directory", path)
	case st.Size() == 0:
		return nil, nil
	}
	db, err := openCurrent(path, &bbolt.Options{Timeout: lockTimeoutOr(0)})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: a gateway is running on it; stop it, and restore into a store no gateway uses", store.ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("opening the store there: %w", err)
	}
	var n int
	err = db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			if string(name) != string(bucketMeta) {
				n += b.Stats().KeyN
			}
			return nil
		})
	})
	if err == nil && n > 0 {
		err = fmt.Errorf("the store there is not empty (%d records): restore into a new file, or move this one away first", n)
	}
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// checkFile opens a store file read-only and checks that this gateway
// reads its format; it returns what it holds.
func checkFile(path string) (store.SnapshotInfo, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: lockTimeoutOr(0)})
	if err != nil {
		return store.SnapshotInfo{}, fmt.Errorf("it is not a store file: %w", err)
	}
	defer db.Close()
	info := store.SnapshotInfo{Kind: Kind}
	err = db.View(func(tx *bbolt.Tx) error {
		f, err := checkFormat(tx)
		if err != nil {
			return err
		}
		if f == "" {
			return errors.New("it holds no store")
		}
		info.Runs, info.Unfinished = countKeys(tx, bucketRunIndex), countKeys(tx, bucketUnfinished)
		return nil
	})
	return info, err
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
