package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/internal/jsonx"
)

// Restore writes the keys a backup holds under s's prefix, which must hold
// none, with no gateway using it. They are written under a prefix of their
// own first, the indexes made to agree with the records, and only once the
// backup was read whole and undamaged are they renamed into place; a
// refused or failed restore removes what it wrote. Keys that have expired
// since the backup (idempotency keys) are left out; the others keep the
// moment they expire.
func Restore(ctx context.Context, r *backup.Reader, s *Store) (store.SnapshotInfo, error) {
	if err := s.begin(); err != nil {
		return store.SnapshotInfo{}, err
	}
	defer s.end()
	info, err := s.restore(ctx, r)
	if err != nil {
		return info, fmt.Errorf("restoring into the Redis store under prefix %q: %w", s.p, err)
	}
	return info, nil
}

func (s *Store) restore(ctx context.Context, r *backup.Reader) (store.SnapshotInfo, error) {
	h := r.Header()
	switch {
	case h.Kind != Kind:
		return store.SnapshotInfo{}, fmt.Errorf("the backup holds a %s store, not a Redis one", h.Kind)
	case h.Format != layout:
		return store.SnapshotInfo{}, fmt.Errorf("the backup holds Redis keys in layout %s, and this gateway reads layout %s: restore it with the gateway version that took it", h.Format, layout)
	}
	notes, err := s.checkEmpty(ctx)
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	// What the empty store says of itself gives way to what the backup
	// says; a store opened next writes it again if the backup had none.
	if len(notes) > 0 {
		if err := s.client.Del(ctx, notes...).Err(); err != nil {
			return store.SnapshotInfo{}, fmt.Errorf("clearing the empty store's notes: %w", err)
		}
	}
	token := make([]byte, 8)
	_, _ = rand.Read(token)
	// Outside the prefix, so that no gateway on it sees them; with the
	// prefix in it, so that a hash tag in it places them as it will.
	tmp := "chaingate-restore:" + hex.EncodeToString(token) + ":" + s.p
	moved := []string{}
	ok := false
	defer func() {
		if !ok {
			s.cleanUp(context.WithoutCancel(ctx), tmp, moved)
		}
	}()
	expires, err := s.writeRecords(ctx, r, tmp)
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	info, err := s.rebuildIndexes(ctx, tmp)
	if err != nil {
		return info, fmt.Errorf("rebuilding the indexes: %w", err)
	}
	if _, err := s.checkEmpty(ctx); err != nil {
		return info, err
	}
	if err := s.move(ctx, tmp, expires, &moved); err != nil {
		return info, err
	}
	ok = true
	return info, nil
}

// checkEmpty refuses a prefix that holds a key, but for the notes a store
// writes of itself when it opens (meta:...), which it returns.
func (s *Store) checkEmpty(ctx context.Context) ([]string, error) {
	found := errors.New("found")
	var first string
	var notes []string
	err := s.scanKeys(ctx, globEscape(s.p)+"*", func(keys []string) error {
		for _, k := range keys {
			if strings.HasPrefix(k[len(s.p):], "meta:") {
				notes = append(notes, k)
				continue
			}
			first = k
			return found
		}
		return nil
	})
	switch {
	case errors.Is(err, found):
		return nil, fmt.Errorf("the prefix holds keys already (%s, ...): restore into a prefix that holds none (?prefix= in the state URL), or delete them first", first)
	case err != nil:
		return nil, err
	}
	return notes, nil
}

// writeRecords writes a backup's keys under tmp, and returns when those
// that expire do, by name after the prefix. The writes go in pipelines of
// about a thousand commands.
func (s *Store) writeRecords(ctx context.Context, r *backup.Reader, tmp string) (map[string]int64, error) {
	expires := map[string]int64{}
	w := &pipeWriter{p: s.client.Pipeline()}
	var cur, typ string // the key being written; "" when it is left out
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		tag, payload, err := r.Next()
		if errors.Is(err, io.EOF) {
			return expires, w.flush(ctx)
		}
		if err != nil {
			return nil, err
		}
		fields, err := backup.Fields(payload)
		if err != nil {
			return nil, err
		}
		switch tag {
		case tagKey:
			if len(fields) < 3 {
				return nil, fmt.Errorf("%w: a key record of %d fields", backup.ErrDamaged, len(fields))
			}
			name, exp := string(fields[0]), string(fields[2])
			typ = string(fields[1])
			at, err := strconv.ParseInt(exp, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: key %s expires at %q", backup.ErrDamaged, name, exp)
			}
			delete(expires, name)
			if cur = tmp + name; at > 0 && at <= time.Now().UnixMilli() {
				cur = "" // expired since the backup
				continue
			}
			if at > 0 {
				expires[name] = at
			}
			if err := w.items(ctx, cur, typ, true, fields[3:]); err != nil {
				return nil, err
			}
		case tagMore:
			if cur == "" {
				continue
			}
			if err := w.items(ctx, cur, typ, false, fields); err != nil {
				return nil, err
			}
		case tagDrop:
			keys := make([]string, len(fields))
			for i, f := range fields {
				keys[i] = tmp + string(f)
				delete(expires, string(f))
			}
			w.p.Del(ctx, keys...)
			cur = ""
		default:
			return nil, fmt.Errorf("%w: a frame of kind %q in a Redis backup", backup.ErrDamaged, tag)
		}
		if w.p.Len() >= 1000 || w.bytes >= 8<<20 {
			if err := w.flush(ctx); err != nil {
				return nil, err
			}
		}
	}
}

// pipeWriter queues a restore's writes.
type pipeWriter struct {
	p     goredis.Pipeliner
	bytes int
}

func (w *pipeWriter) flush(ctx context.Context) error {
	w.bytes = 0
	if w.p.Len() == 0 {
		return nil
	}
	if _, err := w.p.Exec(ctx); err != nil {
		return fmt.Errorf("writing keys: %w", err)
	}
	return nil
}

// items queues the writes of items of a key, new when fresh. The items
// are copied: they are the backup reader's, valid until its next frame.
func (w *pipeWriter) items(ctx context.Context, key, typ string, fresh bool, items [][]byte) error {
	unit := pairs(typ)
	if len(items)%unit != 0 {
		return fmt.Errorf("%w: an odd number of items for a %s", backup.ErrDamaged, typ)
	}
	var cmd string
	switch typ {
	case "hash":
		cmd = "HSET"
	case "zset":
		cmd = "ZADD"
	case "list":
		cmd = "RPUSH"
	case "set":
		cmd = "SADD"
	case "string":
		cmd = "SET"
		if len(items) != 1 {
			return fmt.Errorf("%w: a string of %d values", backup.ErrDamaged, len(items))
		}
	default:
		return fmt.Errorf("%w: a key of type %q", backup.ErrDamaged, typ)
	}
	if fresh {
		w.p.Del(ctx, key)
	}
	for start := 0; start < len(items); start += bigKey * unit {
		chunk := items[start:min(start+bigKey*unit, len(items))]
		args := make([]any, 0, 2+len(chunk))
		args = append(args, cmd, key)
		for i := 0; i < len(chunk); i += unit {
			if typ == "zset" {
				// ZADD takes the score first.
				args = append(args, string(chunk[i+1]), string(chunk[i]))
				w.bytes += len(chunk[i]) + len(chunk[i+1])
				continue
			}
			for _, it := range chunk[i : i+unit] {
				args = append(args, string(it))
				w.bytes += len(it)
			}
		}
		w.p.Do(ctx, args...)
	}
	w.p.PExpire(ctx, key, restoreTTL)
	return nil
}

// rebuildIndexes makes the indexes under prefix p agree with the records
// restored there: the list of runs, the unfinished ones and the finished
// ones by status with the runs' records, the ids of dead-letter entries
// and of kept deliveries with their hashes. The copies of the indexes may name records copied before
// or after them: a member whose record is not there goes, a record that
// is not indexed is added. A run whose record cannot be read back keeps
// what the copied index said of it. An index added to the key layout is
// made to agree here, and named in indexKeys.
func (s *Store) rebuildIndexes(ctx context.Context, p string) (store.SnapshotInfo, error) {
	info := store.SnapshotInfo{Kind: Kind}
	// Each run's index entry, whether it is unfinished, and its status
	// and entry in a finished index (its hash's f) when it ended; nil for
	// a run whose record cannot be read back.
	type entry struct {
		member     string
		unfinished bool
		status     store.RunStatus
		finished   string
	}
	runs := map[string]*entry{}
	err := s.scanKeys(ctx, globEscape(p)+"run:*", func(keys []string) error {
		cmds := make([]*goredis.SliceCmd, len(keys))
		_, err := s.client.Pipelined(ctx, func(pl goredis.Pipeliner) error {
			for i, k := range keys {
				cmds[i] = pl.HMGet(ctx, k, "h", "f")
			}
			return nil
		})
		if err != nil {
			return err
		}
		for i, k := range keys {
			id := k[len(p)+len("run:"):]
			vals := cmds[i].Val()
			var run store.Run
			if h, ok := vals[0].(string); !ok || jsonx.Unmarshal([]byte(h), &run) != nil || run.ID != id {
				runs[id] = nil
				continue
			}
			e := &entry{member: indexMember(run.CreatedAt, id), unfinished: !run.Status.Final(), status: run.Status}
			if f, ok := vals[1].(string); ok && run.Status.Final() {
				e.finished = f
			}
			runs[id] = e
		}
		return nil
	})
	if err != nil {
		return info, err
	}
	var members, unfinished []string
	finished := map[store.RunStatus][]string{}
	for _, e := range runs {
		if e == nil {
			continue
		}
		members = append(members, e.member)
		if e.unfinished {
			unfinished = append(unfinished, e.member[16:])
		}
		if e.finished != "" {
			finished[e.status] = append(finished[e.status], e.finished)
		}
	}
	err = s.agree(ctx, p+"runs", members, func(m string) bool {
		_, ok := runs[m[min(16, len(m)):]]
		return ok
	})
	if err != nil {
		return info, err
	}
	// A finished index lists the runs that ended with its status, each by
	// the entry its hash keeps (f), which deleting the run removes.
	for _, st := range finalStatuses {
		err = s.agree(ctx, p+"finished:"+string(st), finished[st], func(m string) bool {
			e, ok := runs[m[min(16, len(m)):]]
			return ok && (e == nil || e.finished == m && e.status == st)
		})
		if err != nil {
			return info, err
		}
	}
	err = s.agree(ctx, p+"unfinished", unfinished, func(id string) bool {
		e, ok := runs[id]
		return ok && (e == nil || e.unfinished)
	})
	if err != nil {
		return info, err
	}
	for _, h := range [][2]string{{"dlq", "dlqids"}, {"inbox", "inboxids"}} {
		ids := map[string]bool{}
		var list []string
		var cursor uint64
		for {
			items, next, err := s.client.HScan(ctx, p+h[0], cursor, "", int64(bigKey)).Result()
			if err != nil {
				return info, err
			}
			for i := 0; i < len(items); i += 2 {
				if !ids[items[i]] {
					ids[items[i]] = true
					list = append(list, items[i])
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		if err := s.agree(ctx, p+h[1], list, func(id string) bool { return ids[id] }); err != nil {
			return info, err
		}
	}
	// A build of the finished indexes under way when the backup was taken
	// is started again by the next gateway to open the store.
	if v, err := s.client.Get(ctx, p+"meta:finished").Result(); err == nil && v != "done" {
		if err := s.client.Del(ctx, p+"meta:finished").Err(); err != nil {
			return info, err
		}
	}
	info.Runs, info.Unfinished = len(runs), len(unfinished)
	return info, nil
}

// agree makes a score-0 sorted set hold want, and of what it held only
// the members keep keeps.
func (s *Store) agree(ctx context.Context, key string, want []string, keep func(string) bool) error {
	var gone []any
	var cursor uint64
	for {
		items, next, err := s.client.ZScan(ctx, key, cursor, "", int64(bigKey)).Result()
		if err != nil {
			return err
		}
		for i := 0; i < len(items); i += 2 {
			if !keep(items[i]) {
				gone = append(gone, items[i])
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for start := 0; start < len(gone); start += bigKey {
			p.ZRem(ctx, key, gone[start:min(start+bigKey, len(gone))]...)
		}
		for start := 0; start < len(want); start += bigKey {
			chunk := want[start:min(start+bigKey, len(want))]
			zs := make([]goredis.Z, len(chunk))
			for i, m := range chunk {
				zs[i] = goredis.Z{Member: m}
			}
			p.ZAdd(ctx, key, zs...)
		}
		p.PExpire(ctx, key, restoreTTL)
		return nil
	})
	return err
}

// move renames the keys under tmp into place, the indexes last, and gives
// each its expiry; the names it moved are added to moved.
func (s *Store) move(ctx context.Context, tmp string, expires map[string]int64, moved *[]string) error {
	var data, indexes []string
	err := s.scanKeys(ctx, globEscape(tmp)+"*", func(keys []string) error {
		for _, k := range keys {
			if name := k[len(tmp):]; isIndex(name) {
				indexes = append(indexes, name)
			} else {
				data = append(data, name)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, names := range [][]string{data, indexes} {
		for start := 0; start < len(names); start += bigKey {
			chunk := names[start:min(start+bigKey, len(names))]
			calls := make([]call, len(chunk))
			for i, n := range chunk {
				calls[i] = call{keys: []string{tmp + n, s.p + n}, args: []any{expires[n]}}
			}
			cmds, err := s.evalEach(ctx, moveScript, calls)
			if cmds == nil {
				return fmt.Errorf("moving keys into place: %w", err)
			}
			var failed error
			for i, n := range chunk {
				switch res, err := cmds[i].Int64(); {
				case err == nil && res == 1:
					*moved = append(*moved, s.p+n)
				case failed != nil:
				case err != nil:
					failed = fmt.Errorf("moving %s into place: %w", s.p+n, err)
				default:
					failed = fmt.Errorf("moving %s into place: a key of that name appeared under the prefix meanwhile; is a gateway using it?", s.p+n)
				}
			}
			if failed != nil {
				return failed
			}
		}
	}
	return nil
}

func isIndex(name string) bool {
	return slices.Contains(indexKeys, name) || strings.HasPrefix(name, "finished:")
}

// cleanUp removes what a failed restore wrote: the keys under tmp, and
// those it moved into place.
func (s *Store) cleanUp(ctx context.Context, tmp string, moved []string) {
	var keys []string
	err := s.scanKeys(ctx, globEscape(tmp)+"*", func(page []string) error {
		keys = append(keys, page...)
		return nil
	})
	keys = append(keys, moved...)
	for start := 0; start < len(keys); start += bigKey {
		err = errors.Join(err, s.client.Unlink(ctx, keys[start:min(start+bigKey, len(keys))]...).Err())
	}
	if err != nil {
		s.log.Warn("removing what a failed restore wrote; its keys expire within a day", "prefix", tmp, "err", err)
	}
}
