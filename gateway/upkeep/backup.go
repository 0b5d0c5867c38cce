package upkeep

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/chain/store/bolt"
	redisstore "github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/gateway"
)

// StateName is a state URL as it may be shown: a Redis password hidden.
func StateName(state string) string {
	if file := gateway.StateFile(state); file != "" {
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
		return bolt.SnapshotFile(ctx, gateway.StateFile(state), w, 0)
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
		return bolt.Restore(ctx, r, gateway.StateFile(state))
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
	return bolt.Compact(ctx, gateway.StateFile(state), 0)
}
