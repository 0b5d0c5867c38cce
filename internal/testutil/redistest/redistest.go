// Package redistest gives integration tests a Redis to run against: a URL
// with a prefix of their own, whose keys are deleted when the test ends.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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
	// The shared test Redis keeps nothing across a restart; the tests of
	// durability start a Redis of their own (Server).
	return "redis://" + addr + "/0?allow_volatile=true&prefix=" + url.QueryEscape(prefix)
}

// Server is a redis-server a test started itself, so it may stop and
// restart it without touching the shared one.
type Server struct {
	tb   testing.TB
	Addr string
	Dir  string // its working directory: where its files go
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a redis-server on a free port of 127.0.0.1, in a directory
// of the test's own, with the given extra arguments (such as
// "--appendonly", "yes"), and kills it when tb ends. Without redis-server
// it skips tb, or fails it when $CI is "true".
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("redis-server not found on PATH: %v — CI must run the Redis durability tests", err)
		}
		tb.Skipf("SKIPPING: redis-server not found on PATH (%v) — install Redis to run the durability tests", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	s := &Server{tb: tb, Addr: addr, Dir: tb.TempDir(), args: args}
	s.start()
	tb.Cleanup(s.Kill)
	return s
}

func (s *Server) start() {
	s.tb.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	args := append([]string{"--port", port, "--bind", "127.0.0.1", "--dir", s.Dir, "--save", "", "--daemonize", "no", "--logfile", "redis.log"}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	s.cmd.Dir = s.Dir
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("starting redis-server: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.done)
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
			s.tb.Fatalf("redis-server on %s exited at start: %s", s.Addr, log)
		default:
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("redis-server on %s did not answer within 30 s: %v", s.Addr, err)
		}
	}
}

// Kill stops the server as a crash would (SIGKILL): what it had not
// written to disk is gone.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Restart kills the server and starts it again on the same port and
// directory, as after a crash.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	s.start()
}

// URL is a store URL for the server with the given query.
func (s *Server) URL(query string) string {
	return "redis://" + s.Addr + "/0?" + query
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
