package upkeep

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
)

// WriteBackup writes the backup take writes to out, and returns what it
// holds and its size. A file is written beside out, synced and checked
// whole before it is renamed to out; "-" is stdout, checked as it goes.
func WriteBackup(out string, stdout io.Writer, take func(io.Writer) (store.SnapshotInfo, error)) (store.SnapshotInfo, int64, error) {
	if out == "-" {
		cw := &countWriter{w: stdout}
		pr, pw := io.Pipe()
		checked := make(chan error, 1)
		var info store.SnapshotInfo
		go func() {
			h, tr, err := backup.Check(io.TeeReader(pr, cw))
			info = store.SnapshotInfo{Kind: h.Kind, Runs: tr.Runs}
			_, _ = io.Copy(io.Discard, pr)
			checked <- err
		}()
		_, err := take(pw)
		pw.CloseWithError(err)
		err = errors.Join(err, <-checked)
		return info, cw.n, err
	}
	dir := filepath.Dir(out)
	f, err := os.CreateTemp(dir, "."+filepath.Base(out)+".tmp-*")
	if err != nil {
		return store.SnapshotInfo{}, 0, fmt.Errorf("writing the backup: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := take(f); err != nil {
		return store.SnapshotInfo{}, 0, err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		return store.SnapshotInfo{}, 0, fmt.Errorf("writing the backup: %w", err)
	}
	h, tr, err := backup.Check(f)
	if err != nil {
		return store.SnapshotInfo{}, 0, fmt.Errorf("checking the backup written: %w", err)
	}
	info := store.SnapshotInfo{Kind: h.Kind, Runs: tr.Runs}
	if err := f.Close(); err != nil {
		return info, 0, fmt.Errorf("writing the backup: %w", err)
	}
	if err := os.Rename(f.Name(), out); err != nil {
		return info, 0, fmt.Errorf("writing the backup: %w", err)
	}
	done = true
	d, err := os.Open(dir)
	if err == nil {
		err = errors.Join(d.Sync(), d.Close())
	}
	if err != nil {
		return info, size, fmt.Errorf("writing the backup: %w", err)
	}
	return info, size, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
