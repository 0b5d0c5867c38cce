// Package brokertest gives integration tests a RabbitMQ to run against: its
// URL, a queue prefix of their own whose queues are deleted when the test
// ends, a way to restart the broker, and a proxy that cuts connections.
//
// Tests hold a lock on the broker while they run, shared by Open and
// exclusive for OpenExclusive, so that a test restarting the broker waits
// for the tests of every process using it, and none start meanwhile. A
// parallel test must call t.Parallel before Open: a test paused by
// t.Parallel while holding the lock would block an exclusive test forever.
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// URLEnv names the variable that overrides the URL of the test RabbitMQ.
const URLEnv = "CHAINGATE_TEST_RABBITMQ"

// URL returns the URL of the test RabbitMQ: $CHAINGATE_TEST_RABBITMQ, or
// amqp://guest:guest@127.0.0.1:5672/.
func URL() string {
	if u := os.Getenv(URLEnv); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// Open returns the broker's URL and a queue prefix no other test uses,
// "cgtest.<16 hex>.", whose queues are deleted when tb ends. If RabbitMQ is
// unreachable it skips tb, or fails it when $CI is "true", so that CI cannot
// pass without running the tests.
func Open(tb testing.TB) (brokerURL, prefix string) {
	tb.Helper()
	return open(tb, false)
}

// OpenExclusive is Open for a test that restarts or otherwise disturbs the
// broker: it waits until no other test uses the broker, and keeps others
// from starting until tb ends.
func OpenExclusive(tb testing.TB) (brokerURL, prefix string) {
	tb.Helper()
	brokerURL, prefix = open(tb, true)
	exclusive.Store(tb, true)
	tb.Cleanup(func() { exclusive.Delete(tb) })
	return brokerURL, prefix
}

// exclusive holds the tests that called OpenExclusive.
var exclusive sync.Map

func open(tb testing.TB, excl bool) (string, string) {
	tb.Helper()
	lockBroker(tb, excl)
	u := URL()
	c, err := dial(u)
	if err != nil {
		missing(tb, "RabbitMQ not reachable at "+redact(u)+": "+err.Error())
	}
	_ = c.Close()
	var r [8]byte
	_, _ = rand.Read(r[:])
	prefix := "cgtest." + hex.EncodeToString(r[:]) + "."
	tb.Cleanup(func() {
		if err := deleteQueues(u, prefix+"items", prefix+"items.dead"); err != nil {
			tb.Errorf("deleting the test's RabbitMQ queues under %s: %v", prefix, err)
		}
	})
	return u, prefix
}

// missing skips tb, or fails it in CI, for want of what the tests need.
func missing(tb testing.TB, what string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s — CI must run the RabbitMQ tests; start it (rabbitmq-server -detached) or set %s", what, URLEnv)
	}
	tb.Skipf("SKIPPING: %s — start RabbitMQ (rabbitmq-server -detached), or set %s=amqp://user:password@host:port/, to run these tests", what, URLEnv)
}

func dial(u string) (*amqp.Connection, error) {
	return amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
}

// redact hides the password of a URL.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(an invalid URL)"
	}
	return p.Redacted()
}

// deleteQueues deletes the named queues, those that exist.
func deleteQueues(u string, names ...string) error {
	c, err := dial(u)
	if err != nil {
		return err
	}
	defer c.Close()
	for _, name := range names {
		// A failed delete closes its channel.
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		_, err = ch.QueueDelete(name, false, false, false)
		if ae := (*amqp.Error)(nil); errors.As(err, &ae) && ae.Code == amqp.NotFound {
			continue
		}
		if err != nil {
			return err
		}
		_ = ch.Close()
	}
	return nil
}

// restartTimeout bounds each rabbitmqctl command of RestartBroker.
const restartTimeout = 90 * time.Second

// RestartBroker stops and starts the RabbitMQ application of the local node
// with rabbitmqctl, and waits until it is up again. Only a test that called
// OpenExclusive may use it.
func RestartBroker(tb testing.TB) {
	tb.Helper()
	if _, ok := exclusive.Load(tb); !ok {
		tb.Fatal("brokertest.RestartBroker needs a test that called OpenExclusive: it disturbs every test using the broker")
	}
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		missing(tb, "rabbitmqctl not found to restart RabbitMQ: "+err.Error())
	}
	for _, cmd := range []string{"stop_app", "start_app", "await_startup"} {
		ctx, cancel := context.WithTimeout(context.Background(), restartTimeout)
		out, err := exec.CommandContext(ctx, ctl, cmd).CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			tb.Fatalf("restarting RabbitMQ: rabbitmqctl %s timed out after %v:\n%s", cmd, restartTimeout, out)
		}
		if err != nil {
			tb.Fatalf("restarting RabbitMQ: rabbitmqctl %s: %v:\n%s", cmd, err, out)
		}
	}
}

// lockTimeout bounds the wait for the broker lock, so that a deadlock (see
// the package comment) fails clearly.
const lockTimeout = 2 * time.Minute

// lockBroker takes the broker lock for tb's duration. Exclusive takers first
// hold a gate that shared takers pass through, so that a stream of shared
// takers cannot starve them.
func lockBroker(tb testing.TB, excl bool) {
	tb.Helper()
	gate := openLockFile(tb, "chaingate-test-rabbitmq.gate")
	defer gate.Close()
	main := openLockFile(tb, "chaingate-test-rabbitmq.lock")
	tb.Cleanup(func() { _ = main.Close() }) // releases the lock
	if err := flock(gate, excl, lockTimeout); err != nil {
		tb.Fatalf("waiting for the RabbitMQ test gate %s: %v (a test holding a shared lock while paused by t.Parallel blocks exclusive tests)", gate.Name(), err)
	}
	if err := flock(main, excl, lockTimeout); err != nil {
		tb.Fatalf("waiting for the RabbitMQ test lock %s: %v (a test holding a shared lock while paused by t.Parallel blocks exclusive tests)", main.Name(), err)
	}
}

func openLockFile(tb testing.TB, name string) *os.File {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), name), os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		tb.Fatalf("opening the RabbitMQ test lock: %v", err)
	}
	return f
}
