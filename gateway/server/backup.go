package server

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/server/internal/connguard"
)

// backupWriteTimeout bounds each write of a backup to its client: a client
// that stops reading does not hold the store's read transaction for ever.
const backupWriteTimeout = time.Minute

// backup streams a backup of the store this gateway holds. It takes a
// full token: a backup holds every run's payload and every step's result.
func (s *Server) backup(w http.ResponseWriter, r *http.Request) {
	snap, ok := s.gw.Store.(store.Snapshotter)
	if !ok {
		s.writeError(w, r, &api.APIError{Status: http.StatusNotImplemented, Code: "not_supported", Message: "this gateway's store cannot be backed up while it serves"})
		return
	}
	// A backup outlasts the request timeout: the read deadline goes, and
	// each write moves the write deadline.
	connguard.HoldOpen(w, backupWriteTimeout)
	dw := &deadlineWriter{w: w, rc: http.NewResponseController(w)}
	buf := bufio.NewWriterSize(dw, 256<<10)
	w.Header().Set("Content-Type", api.BackupContentType)
	w.Header().Set("Content-Disposition", `attachment; filename="chaingate-`+time.Now().UTC().Format("20060102T150405Z")+`.backup"`)
	w.Header().Set("Cache-Control", "no-store")
	start := time.Now()
	info, err := snap.Snapshot(r.Context(), buf)
	if err == nil {
		err = buf.Flush()
	}
	switch {
	case err != nil && dw.n == 0:
		w.Header().Del("Content-Disposition")
		s.writeError(w, r, fmt.Errorf("taking a backup: %w", err))
		return
	case err != nil:
		// Too late for an error answer: the stream is cut instead, and
		// the client finds the backup without its end frame.
		s.log.Error("backup cut short", "err", err, "bytes", dw.n)
		panic(http.ErrAbortHandler)
	}
	s.log.Info("backup taken", "runs", info.Runs, "unfinished", info.Unfinished, "bytes", dw.n, "took", time.Since(start).Round(time.Millisecond))
}

// deadlineWriter moves the connection's write deadline before each write.
type deadlineWriter struct {
	w  io.Writer
	rc *http.ResponseController
	n  int64
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	// Test recorders have no deadlines; the server's connections do.
	_ = d.rc.SetWriteDeadline(time.Now().Add(backupWriteTimeout))
	n, err := d.w.Write(p)
	d.n += int64(n)
	return n, err
}
