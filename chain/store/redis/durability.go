package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Durability says what the store asks of Redis before it counts a commit
// as made, and what it accepts at start.
type Durability struct {
	// AllowVolatile lets the store open on a Redis that would lose its
	// runs when it restarts (no append-only file), with a warning: for
	// demos and tests, never for runs that matter.
	AllowVolatile bool
	// WaitReplicas makes every commit wait until this many replicas hold
	// it (Redis WAIT); a commit they do not acknowledge within WaitTimeout
	// fails, so no provider is called on state a failover could lose.
	WaitReplicas int
	// WaitTimeout bounds that wait; default DefaultWaitTimeout.
	WaitTimeout time.Duration
	// Unchecked skips the check at open: the caller has vouched for this
	// Redis another way, as a split's item runs share the fan-out's Redis
	// with the split's results.
	Unchecked bool
}

// DefaultWaitTimeout is how long a commit waits for its replicas.
const DefaultWaitTimeout = time.Second

// ErrVolatile is returned by Open for a Redis whose data would not survive
// a restart.
var ErrVolatile = errors.New("the gateway's runs would be lost when Redis restarts")

// ErrNotReplicated is returned by a commit that fewer replicas than
// WaitReplicas acknowledged in time.
var ErrNotReplicated = errors.New("commit not replicated")

// parseDurability takes the store's own options from a URL query:
// allow_volatile, wait_replicas and wait_timeout.
func parseDurability(q map[string][]string) (Durability, error) {
	var d Durability
	get := func(k string) (string, bool) {
		v, ok := q[k]
		delete(q, k)
		if !ok || len(v) == 0 {
			return "", false
		}
		return v[len(v)-1], true
	}
	if v, ok := get("allow_volatile"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return d, fmt.Errorf("allow_volatile=%q: want true or false", v)
		}
		d.AllowVolatile = b
	}
	if v, ok := get("wait_replicas"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			return d, fmt.Errorf("wait_replicas=%q: want a count of replicas from 0 to 100", v)
		}
		d.WaitReplicas = n
	}
	if v, ok := get("wait_timeout"); ok {
		t, err := time.ParseDuration(v)
		if err != nil || t <= 0 || t > time.Minute {
			return d, fmt.Errorf("wait_timeout=%q: want a duration up to 1m, e.g. wait_timeout=500ms", v)
		}
		d.WaitTimeout = t
	}
	return d, nil
}

// persistence is what a Redis server keeps across a restart.
type persistence struct {
	aof   bool   // appendonly yes
	fsync string // appendfsync: always, everysec, no; "" when unreadable
	save  string // RDB snapshot schedule; "" when none or unreadable
}

// readPersistence reads the persistence settings of every primary the
// client writes to. INFO is read rather than CONFIG GET alone, since managed
// Redis services often refuse CONFIG.
func readPersistence(ctx context.Context, client goredis.UniversalClient) ([]persistence, error) {
	read := func(ctx context.Context, c *goredis.Client) (persistence, error) {
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return persistence{}, fmt.Errorf("reading INFO persistence from %s: %w", c.Options().Addr, err)
		}
		var p persistence
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "aof_enabled:"); ok {
				p.aof = v == "1"
			}
		}
		if vals, err := c.ConfigGet(ctx, "appendfsync").Result(); err == nil {
			p.fsync = vals["appendfsync"]
		}
		if vals, err := c.ConfigGet(ctx, "save").Result(); err == nil {
			p.save = vals["save"]
		}
		return p, nil
	}
	switch c := client.(type) {
	case *goredis.Client:
		p, err := read(ctx, c)
		return []persistence{p}, err
	case *goredis.ClusterClient:
		var all []persistence
		var mu sync.Mutex
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
			p, err := read(ctx, n)
			mu.Lock()
			defer mu.Unlock()
			all = append(all, p)
			return err
		})
		return all, err
	}
	return nil, fmt.Errorf("reading persistence settings: unsupported client %T", client)
}

// checkDurability refuses, or warns about, a Redis that would lose
// committed runs. A commit must survive a Redis restart: an append-only
// file does that; waiting for replicas does it across a failover.
func (s *Store) checkDurability(ctx context.Context, addr string, d Durability) error {
	if d.Unchecked {
		return nil
	}
	if _, cluster := s.client.(*goredis.ClusterClient); cluster && d.WaitReplicas > 0 {
		return errors.New("wait_replicas is not supported on Redis Cluster, where one connection does not reach every shard; give each shard an append-only file with appendfsync always instead")
	}
	all, err := readPersistence(ctx, s.client)
	if err != nil {
		if d.AllowVolatile {
			s.log.Warn("cannot read Redis's persistence settings; going on because allow_volatile=true", "addr", addr, "err", err)
			return nil
		}
		return fmt.Errorf("checking that Redis at %s keeps the gateway's runs across a restart: %w (check its persistence yourself, then add allow_volatile=true to the state URL to skip this check)", addr, err)
	}
	for _, p := range all {
		switch {
		case !p.aof && d.WaitReplicas == 0:
			how := "no append-only file and no snapshots"
			if p.save != "" {
				how = fmt.Sprintf("no append-only file, only snapshots (save %q), which lose whatever came after the last one", p.save)
			}
			if d.AllowVolatile {
				s.log.Warn("RUNS ARE NOT DURABLE: Redis keeps "+how+"; a Redis restart loses every run in it. Allowed by allow_volatile=true: use it only for demos and tests", "addr", addr)
				return nil
			}
			return fmt.Errorf("opening Redis store at %s: Redis keeps %s: %w. Set `appendonly yes` and `appendfsync always` on it (docs/operations.md, \"Redis durability\"), or add wait_replicas=1 to the state URL so every commit reaches a replica, or allow_volatile=true to accept losing runs (demos and tests)", addr, how, ErrVolatile)
		case p.aof && p.fsync != "always" && d.WaitReplicas == 0:
			fsync := p.fsync
			if fsync == "" {
				fsync = "unknown (CONFIG GET refused)"
			}
			s.log.Warn("Redis writes its append-only file to disk only every second or so: a crash of Redis's machine may lose the runs' last second of changes; appendfsync always or wait_replicas closes the gap", "addr", addr, "appendfsync", fsync)
		}
	}
	return nil
}

// wait blocks until d.WaitReplicas replicas hold the writes sent on the
// pipeline's connection so far; it must be queued on the same pipeline as
// those writes, since WAIT counts only its own connection's writes.
func (d Durability) wait(ctx context.Context, p goredis.Pipeliner) *goredis.Cmd {
	return p.Do(ctx, "WAIT", d.WaitReplicas, d.waitTimeout().Milliseconds())
}

func (d Durability) waitTimeout() time.Duration {
	if d.WaitTimeout <= 0 {
		return DefaultWaitTimeout
	}
	return d.WaitTimeout
}
