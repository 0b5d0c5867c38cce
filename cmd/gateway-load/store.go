package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// smallChain is a chain of three echo steps.
const smallChain = `
[[chains]]
name = "small"
[[chains.steps]]
name = "one"
provider = "echo"
[[chains.steps]]
name = "two"
provider = "echo"
[[chains.steps]]
name = "three"
provider = "echo"
`

// loadStore is the fresh store a load serves its gateway on: a bbolt file
// in the load's directory, or a prefix of its own in Redis.
type loadStore struct {
	kind, file, prefix string
	redis              *goredis.Client
}

func newLoadStore(kind, redisAddr, dir string) *loadStore {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return &loadStore{kind: kind, file: filepath.Join(dir, "gateway.db"), prefix: "chaingate.load." + hex.EncodeToString(r[:]) + ":",
		redis: goredis.NewClient(&goredis.Options{Addr: redisAddr})}
}

// url is the store's [gateway] state.
func (s *loadStore) url() string {
	if s.kind == "redis" {
		return "redis://" + s.redis.Options().Addr + "/0?allow_volatile=true&prefix=" + s.prefix
	}
	return "bolt://" + s.file
}

// close deletes what the load left in Redis.
func (s *loadStore) close() {
	if s.kind == "redis" {
		ctx := context.Background()
		for it := s.redis.Scan(ctx, 0, s.prefix+"*", 1000).Iterator(); it.Next(ctx); {
			s.redis.Unlink(ctx, it.Val())
		}
	}
	_ = s.redis.Close()
}

// size is how much room the store takes: the bbolt file's size, or
// Redis's used_memory.
func (s *loadStore) size(ctx context.Context) string {
	if s.kind != "redis" {
		fi, err := os.Stat(s.file)
		if err != nil {
			return "?"
		}
		return fmt.Sprintf("file %.1f MiB", float64(fi.Size())/(1<<20))
	}
	info, err := s.redis.Info(ctx, "memory").Result()
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return fmt.Sprintf("Redis used_memory %.1f MiB", n/(1<<20))
		}
	}
	return "?"
}
