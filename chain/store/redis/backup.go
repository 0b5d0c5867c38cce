package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/internal/jsonx"
)

// A backup of the Redis store is a copy of its keys, each written as what
// it holds (a hash's fields and values, a list's items, ...) rather than
// as a DUMP payload: a payload can be restored only into a Redis of the
// same version or a later one, the keys' contents into any.
//
// Redis has no transaction that reads every key at once without stopping
// every gateway, so the copy is consistent run by run: each run's four
// keys are read together, by one script, so that a restored run resumes
// as after a crash. A run too large to read at once (more than bigKey
// step records or events, as a split of a million items) is read a page
// at a time and kept only if its record, which every commit rewrites, did
// not change meanwhile; otherwise it is copied again from a copy of its
// keys that Redis takes in one transaction (COPY, Redis 6.2 or later).
// Other keys are copied one by one; the indexes (of runs, unfinished runs,
// dead-letter entries and kept deliveries) are made to agree with the
// records restored (rebuildIndexes). Leases are left out: a restored run
// is taken up at once.

// Kind names this store in a backup's header.
const Kind = "redis"

// layout is the version of the key layout (the package comment) a backup
// holds; restore refuses another.
const layout = "1"

// Frame tags of a Redis backup.
const (
	// tagKey starts a key: its name after the prefix, its type, when it
	// expires (unix ms; 0 never), then items of what it holds.
	tagKey = 'K'
	// tagMore holds more items of the key before.
	tagMore = 'A'
	// tagDrop names keys to drop: a run copied while it changed, which is
	// copied again after.
	tagDrop = 'X'
)

// bigKey is how many elements a key may hold and still be read in one
// command; a larger one is read a page at a time.
var bigKey = 1000

// frameBytes bounds the items one frame holds (one item may be larger).
const frameBytes = 4 << 20

const (
	// scratchTTL bounds how long the frozen copy of a run outlives a
	// backup that died while reading it.
	scratchTTL = time.Hour
	// restoreTTL bounds how long the keys of a restore that died before
	// moving them into place stay.
	restoreTTL = 24 * time.Hour
)

// indexKeys are the keys that index others; a restore makes them agree
// with the records restored (rebuildIndexes), and moves them into place
// last. The finished indexes are finished:STATUS.
var indexKeys = []string{"runs", "unfinished", "dlqids", "inboxids"}

// keyKind is what a backup does with a key, by its name after the prefix.
type keyKind int

const (
	copyKey keyKind = iota // copied as it is
	copyRun                // a run's record: its keys are copied together
	withRun                // one of a run's keys, copied with its record
	leftOut                // not copied: leases, a backup's scratch keys
)

func kindOf(rest string) (keyKind, string) {
	part, id, _ := strings.Cut(rest, ":")
	switch part {
	case "run":
		return copyRun, id
	case "stepkeys", "steps", "events":
		return withRun, id
	case "lease", "backup":
		return leftOut, ""
	}
	return copyKey, ""
}

// runParts are the names of a run's keys after the prefix, without its id,
// and their types.
var runParts = [4]struct{ name, typ string }{{"run:", "hash"}, {"stepkeys:", "zset"}, {"steps:", "hash"}, {"events:", "list"}}

// copyRunScript reads a run's keys together: {0} when the run is gone,
// {2, header} when one of its keys holds more than ARGV[1] elements, else
// {1, run, step keys, steps, events, then each key's PTTL}.
//
// KEYS: run, step keys, steps, events.
var copyRunScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0}
end
local lim = tonumber(ARGV[1])
if redis.call('ZCARD', KEYS[2]) > lim or redis.call('HLEN', KEYS[3]) > lim or redis.call('LLEN', KEYS[4]) > lim then
  return {2, redis.call('HGET', KEYS[1], 'h') or ''}
end
return {1, redis.call('HGETALL', KEYS[1]), redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'), redis.call('HGETALL', KEYS[3]),
  redis.call('LRANGE', KEYS[4], 0, -1), redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2]), redis.call('PTTL', KEYS[3]), redis.call('PTTL', KEYS[4])}
`)

// copyKeyScript reads a key: {type, PTTL, elements, and what it holds
// when it has no more than ARGV[1] elements}.
//
// KEYS: the key.
var copyKeyScript = goredis.NewScript(`
local k, lim = KEYS[1], tonumber(ARGV[1])
local t = redis.call('TYPE', k).ok
local ttl = redis.call('PTTL', k)
local n, v = 0, nil
if t == 'string' then
  n, v = 1, {redis.call('GET', k)}
elseif t == 'hash' then
  n = redis.call('HLEN', k)
  if n <= lim then v = redis.call('HGETALL', k) end
elseif t == 'zset' then
  n = redis.call('ZCARD', k)
  if n <= lim then v = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES') end
elseif t == 'list' then
  n = redis.call('LLEN', k)
  if n <= lim then v = redis.call('LRANGE', k, 0, -1) end
elseif t == 'set' then
  n = redis.call('SCARD', k)
  if n <= lim then v = redis.call('SMEMBERS', k) end
end
return {t, ttl, n, v}
`)

// moveScript renames a restored key into place unless its place is taken,
// and gives it its expiry: 1 when moved, 0 when the place was taken.
//
// KEYS: the restored key, its place. ARGV: when it expires (unix ms; 0
// never).
var moveScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
redis.call('RENAME', KEYS[1], KEYS[2])
if ARGV[1] == '0' then
  redis.call('PERSIST', KEYS[2])
else
  redis.call('PEXPIREAT', KEYS[2], ARGV[1])
end
return 1
`)

var _ store.Snapshotter = (*Store)(nil)

// Snapshot implements store.Snapshotter.
func (s *Store) Snapshot(ctx context.Context, w io.Writer) (store.SnapshotInfo, error) {
	if err := s.begin(); err != nil {
		return store.SnapshotInfo{}, err
	}
	defer s.end()
	info, err := s.snapshot(ctx, w)
	if err != nil {
		return info, fmt.Errorf("backing up the Redis store under prefix %q: %w", s.p, err)
	}
	return info, nil
}

func (s *Store) snapshot(ctx context.Context, w io.Writer) (store.SnapshotInfo, error) {
	info := store.SnapshotInfo{Kind: Kind}
	bw, err := backup.NewWriter(w, backup.Header{Kind: Kind, Format: layout, Created: time.Now().UTC(), Source: s.p})
	if err != nil {
		return info, err
	}
	c := &copier{s: s, w: &recordWriter{bw: bw}, seen: map[string]bool{}, info: &info}
	err = s.scanKeys(ctx, globEscape(s.p)+"*", func(keys []string) error {
		var runs, others []string
		for _, k := range keys {
			switch kind, id := kindOf(k[len(s.p):]); kind {
			case copyRun:
				// SCAN may name a key twice. A key copied twice is
				// restored once (the second copy replaces the first),
				// but a run would be counted twice.
				if !c.seen[id] {
					c.seen[id] = true
					runs = append(runs, id)
				}
			case copyKey:
				others = append(others, k)
			}
		}
		// A page's runs are read in a few round trips, each of runsAtOnce
		// runs, so that what is held in memory stays small.
		for len(runs) > 0 {
			n := min(len(runs), runsAtOnce)
			if err := c.runs(ctx, runs[:n]); err != nil {
				return err
			}
			runs = runs[n:]
		}
		return c.keys(ctx, others)
	})
	if err != nil {
		return info, err
	}
	return info, bw.Close(backup.Trailer{Runs: info.Runs})
}

// runsAtOnce is how many runs one round trip of a backup reads.
const runsAtOnce = 50

// copier writes a backup's records.
type copier struct {
	s *Store
	w *recordWriter
	// seen are the ids of the runs copied.
	seen map[string]bool
	info *store.SnapshotInfo
}

// expireAt turns a PTTL into when the key expires; 0 for never.
func expireAt(pttl int64) int64 {
	if pttl <= 0 {
		return 0
	}
	return time.Now().UnixMilli() + pttl
}

// runs copies the runs with these ids.
func (c *copier) runs(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	calls := make([]call, len(ids))
	for i, id := range ids {
		calls[i] = call{keys: runKeys(c.s.p, id), args: []any{bigKey}}
	}
	cmds, err := c.s.evalEach(ctx, copyRunScript, calls)
	if err != nil {
		return fmt.Errorf("reading runs: %w", err)
	}
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil || len(res) < 1 {
			return fmt.Errorf("reading run %s: %w", ids[i], err)
		}
		switch code, _ := res[0].(int64); {
		case code == 0:
			continue // gone since the scan
		case code == 2 && len(res) == 2:
			header, _ := res[1].(string)
			if err := c.bigRun(ctx, ids[i], header); err != nil {
				return err
			}
			continue
		case code != 1 || len(res) != 9:
			return fmt.Errorf("reading run %s: a reply of %d values", ids[i], len(res))
		}
		for j, part := range runParts {
			items, _ := res[1+j].([]any)
			pttl, _ := res[5+j].(int64)
			if err := c.w.key(part.name+ids[i], part.typ, expireAt(pttl), strs(items)); err != nil {
				return err
			}
			if j == 0 {
				c.count(hashField(items, "h"))
			}
		}
	}
	return nil
}

// count counts a run copied, from its record.
func (c *copier) count(header string) {
	c.info.Runs++
	var h struct {
		Status store.RunStatus `json:"status"`
	}
	if jsonx.Unmarshal([]byte(header), &h) == nil && !h.Status.Final() {
		c.info.Unfinished++
	}
}

// bigRun copies a run too large to read at once: a page at a time, kept
// when the run's record did not change meanwhile, else again from a copy
// Redis makes of its keys at once.
func (c *copier) bigRun(ctx context.Context, id, header string) error {
	names := make([]string, len(runParts))
	for i, part := range runParts {
		names[i] = part.name + id
	}
	live := runKeys(c.s.p, id)
	if err := c.pageAll(ctx, live, names); err != nil {
		return err
	}
	now, err := c.s.client.HGet(ctx, live[0], "h").Result()
	switch {
	case errors.Is(err, goredis.Nil):
		return c.w.drop(names) // deleted meanwhile
	case err != nil:
		return fmt.Errorf("reading run %s: %w", id, err)
	case now == header:
		c.count(header)
		return nil
	}
	if err := c.w.drop(names); err != nil {
		return err
	}
	token := make([]byte, 8)
	_, _ = rand.Read(token)
	frozen := runKeys(c.s.p+"backup:"+hex.EncodeToString(token)+":", id)
	defer c.s.client.Unlink(context.WithoutCancel(ctx), frozen...)
	var exists *goredis.IntCmd
	_, err = c.s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		exists = p.Exists(ctx, live[0])
		for i := range live {
			p.Do(ctx, "COPY", live[i], frozen[i])
			p.PExpire(ctx, frozen[i], scratchTTL)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("copying run %s: %w", id, err)
	}
	if exists.Val() == 0 {
		return nil
	}
	if err := c.pageAll(ctx, frozen, names); err != nil {
		return err
	}
	h, err := c.s.client.HGet(ctx, frozen[0], "h").Result()
	if err != nil {
		return fmt.Errorf("reading run %s: %w", id, err)
	}
	c.count(h)
	return nil
}

// pageAll copies a run's keys a page at a time, under names; the run's
// keys have no expiry.
func (c *copier) pageAll(ctx context.Context, keys, names []string) error {
	for i, part := range runParts {
		if err := c.page(ctx, keys[i], names[i], part.typ, 0); err != nil {
			return fmt.Errorf("reading %s: %w", keys[i], err)
		}
	}
	return nil
}

// keys copies keys as they are, whole when small, else a page at a time.
func (c *copier) keys(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	calls := make([]call, len(keys))
	for i, k := range keys {
		calls[i] = call{keys: []string{k}, args: []any{bigKey}}
	}
	cmds, err := c.s.evalEach(ctx, copyKeyScript, calls)
	if err != nil {
		return fmt.Errorf("reading keys: %w", err)
	}
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil || len(res) < 3 {
			return fmt.Errorf("reading %s: %v values, %w", keys[i], len(res), err)
		}
		typ, _ := res[0].(string)
		pttl, _ := res[1].(int64)
		name := keys[i][len(c.s.p):]
		switch {
		case typ == "none":
			continue // gone since the scan
		case typ != "string" && typ != "hash" && typ != "zset" && typ != "list" && typ != "set":
			return fmt.Errorf("key %s is a %s, which a backup does not copy", keys[i], typ)
		case len(res) == 4:
			items, _ := res[3].([]any)
			err = c.w.key(name, typ, expireAt(pttl), strs(items))
		default:
			err = c.page(ctx, keys[i], name, typ, expireAt(pttl))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// page copies a key a page at a time: each element is one the key held,
// the whole as consistent as what writes to it meanwhile allow.
func (c *copier) page(ctx context.Context, key, name, typ string, expires int64) error {
	started := false
	put := func(items []string) error {
		if started {
			return c.w.more(typ, items)
		}
		if len(items) == 0 {
			return nil
		}
		started = true
		return c.w.key(name, typ, expires, items)
	}
	client := c.s.client
	if typ == "list" {
		for start := int64(0); ; start += int64(bigKey) {
			items, err := client.LRange(ctx, key, start, start+int64(bigKey)-1).Result()
			if err != nil {
				return err
			}
			if err := put(items); err != nil {
				return err
			}
			if len(items) < bigKey {
				return nil
			}
		}
	}
	if typ == "string" {
		v, err := client.Get(ctx, key).Result()
		if errors.Is(err, goredis.Nil) {
			return nil
		}
		if err != nil {
			return err
		}
		return put([]string{v})
	}
	var cursor uint64
	for {
		var items []string
		var err error
		switch typ {
		case "hash":
			items, cursor, err = client.HScan(ctx, key, cursor, "", int64(bigKey)).Result()
		case "zset":
			items, cursor, err = client.ZScan(ctx, key, cursor, "", int64(bigKey)).Result()
		case "set":
			items, cursor, err = client.SScan(ctx, key, cursor, "", int64(bigKey)).Result()
		default:
			return fmt.Errorf("a %s, which a backup does not copy", typ)
		}
		if err != nil {
			return err
		}
		if err := put(items); err != nil {
			return err
		}
		if cursor == 0 {
			return nil
		}
	}
}

// pairs is how many items make one element of a key of type typ.
func pairs(typ string) int {
	if typ == "hash" || typ == "zset" {
		return 2
	}
	return 1
}

// recordWriter writes keys as frames of at most about frameBytes, split
// only between elements.
type recordWriter struct {
	bw  *backup.Writer
	buf []byte
}

func (w *recordWriter) key(name, typ string, expires int64, items []string) error {
	if len(items) == 0 {
		return nil // an absent key: a run without steps yet
	}
	p := backup.AppendString(w.buf[:0], name)
	p = backup.AppendString(p, typ)
	p = backup.AppendString(p, strconv.FormatInt(expires, 10))
	return w.items(tagKey, p, typ, items)
}

func (w *recordWriter) more(typ string, items []string) error {
	if len(items) == 0 {
		return nil
	}
	return w.items(tagMore, w.buf[:0], typ, items)
}

func (w *recordWriter) items(tag byte, p []byte, typ string, items []string) error {
	unit := pairs(typ)
	for i, it := range items {
		if i > 0 && i%unit == 0 && len(p) >= frameBytes {
			if err := w.bw.Frame(tag, p); err != nil {
				return err
			}
			tag, p = tagMore, p[:0]
		}
		p = backup.AppendString(p, it)
	}
	w.buf = p[:0]
	return w.bw.Frame(tag, p)
}

func (w *recordWriter) drop(names []string) error {
	var p []byte
	for _, n := range names {
		p = backup.AppendString(p, n)
	}
	return w.bw.Frame(tagDrop, p)
}

// runKeys are the names of a run's keys under prefix p, as runParts.
func runKeys(p, id string) []string {
	out := make([]string, len(runParts))
	for i, part := range runParts {
		out[i] = p + part.name + id
	}
	return out
}

func strs(items []any) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i], _ = it.(string)
	}
	return out
}

func hashField(items []any, field string) string {
	for i := 0; i+1 < len(items); i += 2 {
		if f, _ := items[i].(string); f == field {
			v, _ := items[i+1].(string)
			return v
		}
	}
	return ""
}

// call is one run of a script.
type call struct {
	keys []string
	args []any
}

// evalEach runs script once per call, in one round trip, and returns the
// error of the first that failed with every command; nil commands when
// they did not run. A script cache emptied meanwhile (SCRIPT FLUSH, a
// failover) is loaded again, once.
func (s *Store) evalEach(ctx context.Context, script *goredis.Script, calls []call) ([]*goredis.Cmd, error) {
	for loaded := false; ; loaded = true {
		cmds := make([]*goredis.Cmd, len(calls))
		_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, c := range calls {
				cmds[i] = script.EvalSha(ctx, p, c.keys, c.args...)
			}
			return nil
		})
		if err != nil && !loaded && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := script.Load(ctx, s.client).Err(); err != nil {
				return nil, fmt.Errorf("loading a script: %w", err)
			}
			continue
		}
		// The commands ran: each has its own result, failed or not.
		return cmds, err
	}
}

// scanKeys calls fn with the keys matching a pattern, a page at a time;
// on Redis Cluster, every primary's.
func (s *Store) scanKeys(ctx context.Context, match string, fn func([]string) error) error {
	var mu sync.Mutex
	scan := func(ctx context.Context, c *goredis.Client) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return fmt.Errorf("listing keys: %w", err)
			}
			if len(keys) > 0 {
				mu.Lock()
				err = fn(keys)
				mu.Unlock()
				if err != nil {
					return err
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	switch c := s.client.(type) {
	case *goredis.Client:
		return scan(ctx, c)
	case *goredis.ClusterClient:
		return c.ForEachMaster(ctx, scan)
	}
	return fmt.Errorf("listing keys: unsupported client %T", s.client)
}

// globEscape quotes the characters SCAN's MATCH reads as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\*?[]`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
