// Package redistest gives integration tests a Redis to run against: a URL
// with a prefix of their own, whose keys are deleted when the test ends.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// AddrEnv names the variable that overrides the address of the test Redis.
const AddrEnv = "CHAINGATE_TEST_REDIS"

// Addr returns the address of the test Redis: $CHAINGATE_TEST_REDIS, or
// 127.0.0.1:6379.
func Addr() string {
	if a := os.Getenv(AddrEnv); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// Open returns a redis:// URL for the store, with a prefix no other test
// uses, and deletes every key under the prefix when tb ends. If Redis is
// unreachable it skips tb, or fails it when $CI is "true", so that CI
// cannot pass without running the tests.
func Open(tb testing.TB) string {
	tb.Helper()
	var r [8]byte
	_, _ = rand.Read(r[:])
	return OpenPrefix(tb, "cgtest:"+hex.EncodeToString(r[:])+":")
}

// OpenPrefix is Open with the key prefix chosen by the caller, for a test
// that shares one prefix between Redis and another server.
func OpenPrefix(tb testing.TB, prefix string) string {
	tb.Helper()
	addr := Addr()
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		if os.Getenv("CI") == "true" {
			tb.Fatalf("Redis not reachable at %s: %v — CI must run the Redis tests; start redis-server or set %s", addr, err, AddrEnv)
		}
		tb.Skipf("SKIPPING: Redis not reachable at %s: %v — start redis-server (or set %s=host:port) to run these tests", addr, err, AddrEnv)
	}
	tb.Cleanup(func() {
		defer c.Close()
		if err := clean(context.Background(), c, prefix); err != nil {
			tb.Errorf("deleting the test's Redis keys under %s: %v", prefix, err)
		}
	})
	return "redis://" + addr + "/0?prefix=" + url.QueryEscape(prefix)
}

// clean deletes every key under prefix, which holds no glob characters.
func clean(ctx context.Context, c *goredis.Client, prefix string) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}
