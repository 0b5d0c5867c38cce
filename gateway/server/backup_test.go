package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/upkeep"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

const backupAuth = `[gateway.auth]
tokens = ["full-tok"]
read_tokens = ["read-tok"]
`

// TestBackupEndpoint takes a backup through the API of a gateway serving
// each kind of store, with the full token only, and restores it into a
// fresh store of the same kind.
func TestBackupEndpoint(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"bolt", "redis"} {
		t.Run(kind, func(t *testing.T) {
			state, fresh := "", filepath.Join(t.TempDir(), "restored.db")
			if kind == "redis" {
				state, fresh = redistest.Open(t), redistest.Open(t)
			}
			env := newAPIOn(t, backupAuth, state)
			env.token = "full-tok"
			for range 3 {
				if code, _, body := env.call("POST", "/v1/chains/hello/runs?wait=20s", `{}`, nil, nil); code != http.StatusOK {
					t.Fatalf("starting a run: %d %s", code, body)
				}
			}
			for _, tc := range []struct {
				token  string
				status int
			}{{"read-tok", http.StatusForbidden}, {"", http.StatusUnauthorized}} {
				env.token = tc.token
				if code, _, body := env.call("POST", "/v1/admin/backup", "", nil, nil); code != tc.status {
					t.Errorf("a backup with token %q: %d %s, want %d", tc.token, code, body, tc.status)
				}
			}
			env.token = "full-tok"
			code, h, body := env.call("POST", "/v1/admin/backup", "", nil, nil)
			if code != http.StatusOK || h.Get("Content-Type") != api.BackupContentType || !strings.Contains(h.Get("Content-Disposition"), ".backup") {
				t.Fatalf("a backup: %d %v %.200q", code, h, body)
			}
			if hd, tr, err := backup.Check(strings.NewReader(body)); err != nil || hd.Kind != kind || tr.Runs != 3 {
				t.Fatalf("the backup streamed: %+v %+v %v", hd, tr, err)
			}

			var buf bytes.Buffer
			if _, err := api.NewClient(env.url, "full-tok").Backup(context.Background(), &buf); err != nil {
				t.Fatal(err)
			}
			r, err := backup.NewReader(&buf)
			if err != nil {
				t.Fatal(err)
			}
			info, err := upkeep.RestoreState(context.Background(), r, fresh, slog.New(slog.DiscardHandler))
			if err != nil || info.Runs != 3 || info.Unfinished != 0 {
				t.Fatalf("restoring: %+v %v", info, err)
			}
			st, _, err := gateway.OpenStore(context.Background(), fresh, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if page, err := st.ListRuns(context.Background(), store.RunFilter{Chain: "hello"}); err != nil || len(page.Runs) != 3 {
				t.Errorf("runs restored: %d %v", len(page.Runs), err)
			}
			if logs := env.logs.String(); !strings.Contains(logs, `"msg":"backup taken","component":"api","runs":3,`) {
				t.Errorf("the backup was not logged:\n%s", env.logs)
			}
		})
	}
}

// TestStateKindsMustMatch refuses to restore one kind of store's backup
// into the other, and to compact a Redis store.
func TestStateKindsMustMatch(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	w, err := backup.NewWriter(&buf, backup.Header{Kind: "bolt", Format: "3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(backup.Trailer{}); err != nil {
		t.Fatal(err)
	}
	r, err := backup.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	_, err = upkeep.RestoreState(context.Background(), r, "redis://:secret-pw@127.0.0.1:6379/0?prefix=x:", slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "the backup holds a bolt store, and redis://:xxxxx@127.0.0.1:6379/0?prefix=x: names a redis one: restore it into an embedded store") {
		t.Errorf("a bolt backup into Redis: %v", err)
	}
	if _, err := upkeep.CompactState(context.Background(), "redis://127.0.0.1:6379/0"); err == nil || !strings.Contains(err.Error(), "embedded store file") {
		t.Errorf("compacting Redis: %v", err)
	}
	if _, err := upkeep.BackupState(context.Background(), "etcd://x", &buf, nil); err == nil || !strings.Contains(err.Error(), `unsupported state URL scheme "etcd"`) {
		t.Errorf("an unknown store: %v", err)
	}
}
