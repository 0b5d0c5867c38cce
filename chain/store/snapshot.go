package store

import (
	"context"
	"io"
)

// Snapshotter is implemented by a store that can copy itself whole while
// it serves: the backup a gateway streams to an operator. Restoring one is
// each store package's own (it happens with no gateway on the store).
type Snapshotter interface {
	// Snapshot writes a backup of the store (the file format of package
	// backup) to w. Each run in it is as one moment saw it, so that a
	// store restored from it resumes its unfinished runs as after a crash.
	Snapshot(ctx context.Context, w io.Writer) (SnapshotInfo, error)
}

// SnapshotInfo says what a snapshot, or a restore, held.
type SnapshotInfo struct {
	// Kind is the kind of store: "bolt" or "redis".
	Kind string `json:"kind"`
	// Runs counts the runs, and Unfinished those of them not finished.
	Runs       int `json:"runs"`
	Unfinished int `json:"unfinished"`
}
