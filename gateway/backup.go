package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/chain/store/bolt"
	redisstore "github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/gateway/api"
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
	holdOpen(w, backupWriteTimeout)
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

// StateURL is the store a command that works on a store without a gateway
// names: state when given, else the config's [gateway].state, else
// DefaultState, with the secrets its URL reads filled in.
func StateURL(cfg *chain.Config, state string) (string, error) {
	if state == "" && cfg != nil {
		state = cfg.Gateway.State
	}
	if state == "" {
		return DefaultState, nil
	}
	if !strings.Contains(state, "<<") {
		return state, nil
	}
	vals, err := loadSecrets(cfg)
	if err != nil {
		return "", err
	}
	if state, err = fillURL(state, vals); err != nil {
		return "", fmt.Errorf("filling in the secrets of the state URL: %w", err)
	}
	return state, nil
}

// StateName is a state URL as it may be shown: a Redis password hidden.
func StateName(state string) string {
	if file := StateFile(state); file != "" {
		return file
	}
	if u, err := url.Parse(state); err == nil {
		return u.Redacted()
	}
	return "the state URL"
}

// stateKind is the kind of store a state URL names, as a backup's header
// names it.
func stateKind(state string) (string, error) {
	scheme, _, found := strings.Cut(state, "://")
	switch {
	case !found || scheme == "bolt":
		return bolt.Kind, nil
	case scheme == "redis" || scheme == "rediss":
		return redisstore.Kind, nil
	}
	return "", fmt.Errorf("unsupported state URL scheme %q (want bolt://PATH or redis://HOST:PORT/DB)", scheme)
}

// BackupState writes a backup of the store a state URL names to w: an
// embedded store no gateway holds (one a gateway holds is refused with
// store.ErrInUse), or a Redis store, which gateways share.
func BackupState(ctx context.Context, state string, w io.Writer, log *slog.Logger) (store.SnapshotInfo, error) {
	kind, err := stateKind(state)
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	if kind == bolt.Kind {
		return bolt.SnapshotFile(ctx, StateFile(state), w, 0)
	}
	st, err := redisstore.OpenURL(ctx, state, log)
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	info, err := st.Snapshot(ctx, w)
	return info, errors.Join(err, st.Close())
}

// RestoreState brings the backup r reads back into the store a state URL
// names, which must hold nothing and no gateway may use; see bolt.Restore
// and redis.Restore.
func RestoreState(ctx context.Context, r *backup.Reader, state string, log *slog.Logger) (store.SnapshotInfo, error) {
	kind, err := stateKind(state)
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	if h := r.Header(); h.Kind != kind {
		want := map[string]string{bolt.Kind: "an embedded store: bolt://PATH or a file path", redisstore.Kind: "a Redis store: redis://HOST:PORT/DB?prefix=..."}[h.Kind]
		if want == "" {
			want = "a gateway version that knows it"
		}
		return store.SnapshotInfo{}, fmt.Errorf("the backup holds a %s store, and %s names a %s one: restore it into %s", h.Kind, StateName(state), kind, want)
	}
	if kind == bolt.Kind {
		return bolt.Restore(ctx, r, StateFile(state))
	}
	st, err := redisstore.OpenURL(ctx, state, log)
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	info, err := redisstore.Restore(ctx, r, st)
	return info, errors.Join(err, st.Close())
}

// CompactState compacts the embedded store file a state URL names.
func CompactState(ctx context.Context, state string) (bolt.CompactInfo, error) {
	if kind, err := stateKind(state); err != nil {
		return bolt.CompactInfo{}, err
	} else if kind != bolt.Kind {
		return bolt.CompactInfo{}, errors.New("compact works on an embedded store file; Redis frees the memory of deleted keys itself")
	}
	return bolt.Compact(ctx, StateFile(state), 0)
}
