package redis_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
	"github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// TestVolatileRedisRefused: a Redis that keeps nothing across a restart,
// or only snapshots, is refused with what to do about it, unless the URL
// says allow_volatile=true, which opens with a loud warning.
func TestVolatileRedisRefused(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no persistence", nil, "no append-only file and no snapshots"},
		{"snapshots only", []string{"--save", "3600 1"}, `only snapshots (save "3600 1")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.Start(t, tt.args...)
			_, err := redis.OpenURL(ctx, srv.URL("prefix=t:"), nil)
			if !errors.Is(err, redis.ErrVolatile) {
				t.Fatalf("open: %v, want ErrVolatile", err)
			}
			for _, part := range []string{srv.Addr, tt.want, "appendonly yes", "appendfsync always", "wait_replicas=1", "allow_volatile=true"} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error does not say %q: %v", part, err)
				}
			}
			logs := &testutil.Buffer{}
			s, err := redis.OpenURL(ctx, srv.URL("prefix=t:&allow_volatile=true"), slog.New(slog.NewTextHandler(logs, nil)))
			if err != nil {
				t.Fatalf("open with allow_volatile=true: %v", err)
			}
			_ = s.Close()
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "RUNS ARE NOT DURABLE") {
				t.Errorf("allow_volatile=true opened without a warning:\n%s", logs)
			}
		})
	}
	for _, q := range []string{"allow_volatile=maybe", "wait_replicas=-1", "wait_replicas=x", "wait_timeout=0s", "wait_timeout=2h"} {
		if _, err := redis.OpenURL(ctx, "redis://127.0.0.1:1/0?"+q, nil); err == nil || !strings.Contains(err.Error(), strings.Split(q, "=")[0]) {
			t.Errorf("%s: %v, want an error naming the option", q, err)
		}
	}
}

// TestCommittedRunsSurviveRedisRestart kills a Redis with an append-only
// file written on every commit, as a crash would, and finds every run the
// store had committed when it comes back. appendfsync everysec opens too,
// with a warning that a crash may lose the last second.
func TestCommittedRunsSurviveRedisRestart(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	logs := &testutil.Buffer{}
	s, err := redis.OpenURL(ctx, srv.URL("prefix=t:"), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "WARN") {
		t.Errorf("appendfsync always warned:\n%s", logs)
	}
	const n = 50
	var ids []string
	for i := range n {
		run := storetest.NewRun("c", time.Now().UTC())
		run.Seq = 1
		if err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{{Key: fmt.Sprintf("step-%d", i), Status: store.StepSucceeded}}}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.ID)
	}
	_ = s.Close()

	srv.Restart()
	s, err = redis.OpenURL(ctx, srv.URL("prefix=t:"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, id := range ids {
		if _, err := s.Run(ctx, id); err != nil {
			t.Errorf("run %d of %d lost with Redis's restart: %v", i+1, n, err)
			continue
		}
		steps, err := s.Steps(ctx, id, "")
		if err != nil || len(steps) != 1 || steps[0].Key != fmt.Sprintf("step-%d", i) {
			t.Errorf("run %d's steps after the restart: %v, %v", i+1, steps, err)
		}
	}

	everysec := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	logs = &testutil.Buffer{}
	s2, err := redis.OpenURL(ctx, everysec.URL("prefix=t:"), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("appendfsync everysec: %v", err)
	}
	_ = s2.Close()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "appendfsync=everysec") {
		t.Errorf("appendfsync everysec opened without a warning:\n%s", logs)
	}
}

// TestWaitReplicas: with wait_replicas a Redis without an append-only
// file is accepted, since every commit reaches a replica before it
// counts; once the replica is gone, commits fail instead of passing for
// durable.
func TestWaitReplicas(t *testing.T) {
	ctx := context.Background()
	primary, replica := startReplicated(t)
	s, err := redis.OpenURL(ctx, primary.URL("prefix=t:&wait_replicas=1&wait_timeout=10s"), nil)
	if err != nil {
		t.Fatalf("open with wait_replicas=1: %v", err)
	}
	defer s.Close()
	run := storetest.NewRun("c", time.Now().UTC())
	run.Seq = 1
	if err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
		t.Fatalf("commit with a replica: %v", err)
	}
	rc := goredis.NewClient(&goredis.Options{Addr: replica.Addr})
	defer rc.Close()
	if n, err := rc.Exists(ctx, "t:run:"+run.ID).Result(); err != nil || n != 1 {
		t.Errorf("the replica does not hold the run once the commit returned: %d, %v", n, err)
	}

	replica.Kill()
	short, err := redis.OpenURL(ctx, primary.URL("prefix=t:&wait_replicas=1&wait_timeout=200ms"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	err = short.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{{Key: "a", Status: store.StepSucceeded}}})
	if !errors.Is(err, redis.ErrNotReplicated) || !strings.Contains(err.Error(), "0 of the 1 replicas") {
		t.Errorf("commit with the replica gone: %v, want ErrNotReplicated", err)
	}
}

// startReplicated starts a primary without persistence and one replica,
// and waits until the replica is in sync.
func startReplicated(tb testing.TB) (primary, replica *redistest.Server) {
	tb.Helper()
	primary = redistest.Start(tb, "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(primary.Addr)
	replica = redistest.Start(tb, "--replicaof", host, port)
	c := goredis.NewClient(&goredis.Options{Addr: replica.Addr})
	defer c.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return primary, replica
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the replica did not sync within 30 s: %v\n%s", err, info)
		}
	}
}
