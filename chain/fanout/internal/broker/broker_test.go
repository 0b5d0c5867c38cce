package broker_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/chaingate/gateway/chain/fanout/internal/broker"
	"github.com/chaingate/gateway/internal/testutil/brokertest"
)

func open(t testing.TB, u, prefix string, maxRedeliveries int) *broker.Broker {
	t.Helper()
	b, err := broker.Open(t.Context(), broker.Options{
		URL:             u,
		Prefix:          prefix,
		MaxRedeliveries: maxRedeliveries,
		Logger:          slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// messages returns n messages with ids 0 to n-1 in their headers.
func messages(n int) []broker.Message {
	ms := make([]broker.Message, n)
	for i := range ms {
		ms[i] = broker.Message{Headers: map[string]any{"id": int64(i)}, Body: fmt.Appendf(nil, "item %d", i)}
	}
	return ms
}

// consume runs Consume until the returned stop is called or t ends.
func consume(t testing.TB, b *broker.Broker, q broker.Queue, prefetch int, handle func(*broker.Delivery)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Consume(ctx, q, prefetch, handle) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Consume: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// tally counts the deliveries of each message id.
type tally struct {
	mu     sync.Mutex
	counts map[int64]int
}

func (tl *tally) add(d *broker.Delivery) int64 {
	id := d.Headers["id"].(int64)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.counts == nil {
		tl.counts = map[int64]int{}
	}
	tl.counts[id]++
	return id
}

func (tl *tally) count(id int64) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.counts[id]
}

// distinct returns how many ids were delivered, and how many deliveries
// there were.
func (tl *tally) distinct() (ids, deliveries int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, n := range tl.counts {
		deliveries += n
	}
	return len(tl.counts), deliveries
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func depth(t *testing.T, b *broker.Broker, q broker.Queue) int {
	t.Helper()
	n, err := b.Depth(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func receive(t *testing.T, got <-chan *broker.Delivery) *broker.Delivery {
	t.Helper()
	select {
	case d := <-got:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery after 10s")
		return nil
	}
}

func TestPublishConsume(t *testing.T) {
	t.Parallel()
	u, prefix := brokertest.Open(t)
	b := open(t, u, prefix, 3)
	const n = 500
	if err := b.Publish(t.Context(), messages(n)); err != nil {
		t.Fatal(err)
	}
	if got := depth(t, b, broker.Items); got != n {
		t.Errorf("Depth after publishing %d = %d", n, got)
	}
	var tl tally
	stop := consume(t, b, broker.Items, 10, func(d *broker.Delivery) {
		tl.add(d)
		if err := d.Ack(); err != nil {
			t.Error(err)
		}
	})
	waitFor(t, "delivery of every message", 30*time.Second, func() bool { ids, _ := tl.distinct(); return ids == n })
	time.Sleep(200 * time.Millisecond) // for any duplicate
	stop()
	if ids, deliveries := tl.distinct(); deliveries != n {
		t.Errorf("%d deliveries of %d messages, want one each", deliveries, ids)
	}
	if got := depth(t, b, broker.Items); got != 0 {
		t.Errorf("Depth after consuming = %d", got)
	}
}

func TestPrefetch(t *testing.T) {
	t.Parallel()
	u, prefix := brokertest.Open(t)
	b := open(t, u, prefix, 3)
	if err := b.Publish(t.Context(), messages(10)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []*broker.Delivery
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(held) }
	consume(t, b, broker.Items, 3, func(d *broker.Delivery) {
		mu.Lock()
		defer mu.Unlock()
		held = append(held, d)
	})
	waitFor(t, "3 deliveries", 30*time.Second, func() bool { return count() >= 3 })
	time.Sleep(300 * time.Millisecond)
	if got := count(); got != 3 {
		t.Fatalf("%d deliveries unacknowledged with prefetch 3", got)
	}
	mu.Lock()
	first := held[0]
	mu.Unlock()
	if err := first.Ack(); err != nil {
		t.Fatal(err)
	}
	if err := first.Ack(); !errors.Is(err, broker.ErrSettled) {
		t.Errorf("second Ack = %v, want ErrSettled", err)
	}
	waitFor(t, "a 4th delivery after an ack", 30*time.Second, func() bool { return count() >= 4 })
	time.Sleep(300 * time.Millisecond)
	if got := count(); got != 4 {
		t.Fatalf("%d deliveries after acking one of 3 with prefetch 3, want 4", got)
	}
}

func TestRedeliveryToDead(t *testing.T) {
	t.Parallel()
	const maxRedeliveries = 2
	for _, tt := range []struct {
		name    string
		abandon bool // else nack with requeue
	}{
		{"nacked with requeue", false},
		{"left unacked when its consumer stops", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u, prefix := brokertest.Open(t)
			b := open(t, u, prefix, maxRedeliveries)
			headers := map[string]any{"id": "x", "n": int64(7), "ok": true, "tags": []any{"a", int64(1)}}
			if err := b.Publish(t.Context(), []broker.Message{{Headers: headers, Body: []byte("poison")}}); err != nil {
				t.Fatal(err)
			}
			got := make(chan *broker.Delivery, 16)
			handle := func(d *broker.Delivery) { got <- d }
			stop := consume(t, b, broker.Items, 1, handle)
			for i := range maxRedeliveries + 1 {
				d := receive(t, got)
				t.Logf("delivery %d: Redelivered %v, DeliveryCount %d, x-delivery-count %#v", i+1, d.Redelivered, d.DeliveryCount, d.Headers["x-delivery-count"])
				if d.Redelivered != (i > 0) || d.DeliveryCount != i {
					t.Errorf("delivery %d: Redelivered %v, DeliveryCount %d; want %v, %d", i+1, d.Redelivered, d.DeliveryCount, i > 0, i)
				}
				if tt.abandon {
					stop()
					if err := d.Ack(); !errors.Is(err, broker.ErrStale) {
						t.Errorf("Ack after the consumer stopped = %v, want ErrStale", err)
					}
					stop = consume(t, b, broker.Items, 1, handle)
				} else if err := d.Nack(true); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "message in the dead queue", 30*time.Second, func() bool { return depth(t, b, broker.Dead) == 1 })
			stop()
			if len(got) > 0 {
				t.Fatalf("delivered again after %d deliveries with MaxRedeliveries %d", maxRedeliveries+1, maxRedeliveries)
			}
			if n := depth(t, b, broker.Items); n != 0 {
				t.Errorf("items Depth = %d, want 0", n)
			}
			stop = consume(t, b, broker.Dead, 1, handle)
			d := receive(t, got)
			if string(d.Body) != "poison" {
				t.Errorf("dead body = %q", d.Body)
			}
			for k, v := range headers {
				if fmt.Sprint(d.Headers[k]) != fmt.Sprint(v) {
					t.Errorf("dead header %s = %#v, want %#v", k, d.Headers[k], v)
				}
			}
			t.Logf("dead-lettered headers: %v", d.Headers)
			if err := d.Ack(); err != nil {
				t.Fatal(err)
			}
			stop()
		})
	}
}

// hostPort returns the host:port of an AMQP URL.
func hostPort(t *testing.T, u string) *url.URL {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.Host = net.JoinHostPort(p.Hostname(), cmp.Or(p.Port(), "5672"))
	return p
}

// disruption runs a large Publish with a consumer running, and calls
// disrupt once the consumer has had some of the messages and Publish is
// still at work. Every message must be consumed, and the deliveries the
// consumer held unacknowledged must be stale.
func disruption(t *testing.T, b *broker.Broker, n int, disrupt func()) {
	t.Helper()
	var tl tally
	var mu sync.Mutex
	var held []*broker.Delivery // the first few, left unacknowledged
	stop := consume(t, b, broker.Items, 50, func(d *broker.Delivery) {
		tl.add(d)
		mu.Lock()
		defer mu.Unlock()
		if len(held) < 5 && !d.Redelivered {
			held = append(held, d)
			return
		}
		// Acks on a lost channel are stale: the message comes again.
		if err := d.Ack(); err != nil && !errors.Is(err, broker.ErrStale) {
			t.Error(err)
		}
	})
	// The consumer at work first, so that it has some of the large Publish's
	// messages long before that ends.
	ms := messages(n)
	if err := b.Publish(t.Context(), ms[:1]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a first delivery", 30*time.Second, func() bool { ids, _ := tl.distinct(); return ids == 1 })
	published := make(chan error, 1)
	start := time.Now()
	go func() { published <- b.Publish(context.Background(), ms[1:]) }()
	waitFor(t, "first deliveries", 30*time.Second, func() bool { ids, _ := tl.distinct(); return ids >= 200 })
	select {
	case err := <-published:
		t.Fatalf("Publish ended (%v) before the disruption: publish more messages", err)
	default:
	}
	ids, _ := tl.distinct()
	t.Logf("disrupting after %v, %d messages consumed", time.Since(start), ids)
	disrupt()
	for _, d := range held {
		if err := d.Ack(); !errors.Is(err, broker.ErrStale) {
			t.Errorf("Ack of a delivery from the lost connection = %v, want ErrStale", err)
		}
	}
	select {
	case err := <-published:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Publish still at work 30s after the disruption")
	}
	t.Logf("published after %v", time.Since(start))
	waitFor(t, "delivery of every message", 30*time.Second, func() bool { ids, _ := tl.distinct(); return ids == n })
	waitFor(t, "empty items queue", 30*time.Second, func() bool { return depth(t, b, broker.Items) == 0 })
	stop()
	ids, deliveries := tl.distinct()
	t.Logf("%d deliveries of %d messages after %v", deliveries, ids, time.Since(start))
	for _, d := range held {
		if id := d.Headers["id"].(int64); tl.count(id) < 2 {
			t.Errorf("message %d, unacknowledged on the lost connection, was not delivered again", id)
		}
	}
}

func TestConnectionCut(t *testing.T) {
	t.Parallel()
	u, prefix := brokertest.Open(t)
	pu := hostPort(t, u)
	proxy := brokertest.Proxy(t, pu.Host)
	pu.Host = proxy.Addr()
	b := open(t, pu.String(), prefix, 5)
	disruption(t, b, 20000, func() {
		proxy.Cut()
		time.Sleep(500 * time.Millisecond)
		proxy.Restore()
	})
}

func TestBrokerRestart(t *testing.T) {
	u, prefix := brokertest.OpenExclusive(t)
	b := open(t, u, prefix, 5)
	disruption(t, b, 20000, func() { brokertest.RestartBroker(t) })
}

// TestQueueDeleted deletes the items queue under a consumer and a publisher:
// the consumer is cancelled and subscribes again, Publish has its messages
// returned and sends them again, and both declare the queue anew.
func TestQueueDeleted(t *testing.T) {
	t.Parallel()
	u, prefix := brokertest.Open(t)
	b := open(t, u, prefix, 3)
	var tl tally
	consume(t, b, broker.Items, 10, func(d *broker.Delivery) {
		tl.add(d)
		if err := d.Ack(); err != nil {
			t.Error(err)
		}
	})
	// RabbitMQ 3.10 can subscribe a consumer to a quorum queue being deleted
	// without ever cancelling it: delete only once the consumer is at work.
	const n = 50
	ms := messages(n)
	if err := b.Publish(t.Context(), ms[:1]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a first delivery", 30*time.Second, func() bool { ids, _ := tl.distinct(); return ids == 1 })
	c, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(prefix+"items", false, false, false); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(t.Context(), ms[1:]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "delivery of every message", 30*time.Second, func() bool { ids, _ := tl.distinct(); return ids == n })
}

func TestOpenFails(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	const password = "s3cret-pa55"
	for _, tt := range []struct {
		name, url, want string
	}{
		{"closed port", "amqp://guest:" + password + "@" + closed + "/", "connecting to RabbitMQ at " + closed},
		{"invalid URL", "amqp://guest:" + password + "@127.0.0.1:port/", "parsing RabbitMQ URL"},
		{"not AMQP", "http://guest:" + password + "@127.0.0.1/", "parsing RabbitMQ URL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, err := broker.Open(t.Context(), broker.Options{URL: tt.url, Prefix: "x."})
			if err == nil {
				t.Fatal("Open succeeded")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("error %q contains the password", err)
			}
			// A URL that cannot work is refused at once, not retried.
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("Open took %v to fail", d)
			}
		})
	}
}

func TestOpenMismatch(t *testing.T) {
	t.Parallel()
	u, prefix := brokertest.Open(t)
	open(t, u, prefix, 2)
	_, err := broker.Open(t.Context(), broker.Options{URL: u, Prefix: prefix, MaxRedeliveries: 3})
	var te *broker.TopologyError
	if !errors.As(err, &te) {
		t.Fatalf("Open with another MaxRedeliveries = %v, want a TopologyError", err)
	}
	t.Log(err)
	if te.Queue != prefix+"items" || !strings.Contains(err.Error(), "delete it or use another prefix") {
		t.Errorf("error %q does not name queue %sitems and what to do", err, prefix)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	u, prefix := brokertest.Open(t)
	b := open(t, u, prefix, 3)
	consumed := make(chan error, 1)
	go func() { consumed <- b.Consume(context.Background(), broker.Items, 1, func(*broker.Delivery) {}) }()
	time.Sleep(100 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-consumed:
		if !errors.Is(err, broker.ErrClosed) {
			t.Errorf("Consume after Close = %v, want ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Consume still running 30s after Close")
	}
	if err := b.Publish(t.Context(), messages(1)); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
}

// BenchmarkDelivery publishes one message at a time to the quorum queue,
// the broker otherwise idle as it is between small splits, and reports the
// median time from publishing it to its delivery: a queue of this kind
// hands a message on only once it has committed it.
func BenchmarkDelivery(b *testing.B) {
	u, prefix := brokertest.Open(b)
	br := open(b, u, prefix, 3)
	got := make(chan *broker.Delivery, 1)
	consume(b, br, broker.Items, 8, func(d *broker.Delivery) { got <- d })
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		if err := br.Publish(b.Context(), messages(1)); err != nil {
			b.Fatal(err)
		}
		select {
		case d := <-got:
			took = append(took, time.Since(start))
			if err := d.Ack(); err != nil {
				b.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			b.Fatal("no delivery after 10s")
		}
		b.StopTimer()
		time.Sleep(5 * time.Millisecond)
		b.StartTimer()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "µs-to-delivery")
}

// TestSubscriptionKeptAcrossChecks holds a delivery unacknowledged past two
// of the consumer's looks at its queue: a healthy subscription counts as the
// queue's consumer, so it is kept and the delivery is not sent again.
func TestSubscriptionKeptAcrossChecks(t *testing.T) {
	t.Parallel()
	u, prefix := brokertest.Open(t)
	b := open(t, u, prefix, 3)
	var tl tally
	consume(t, b, broker.Items, 10, func(d *broker.Delivery) { tl.add(d) })
	if err := b.Publish(t.Context(), messages(1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a first delivery", 30*time.Second, func() bool { ids, _ := tl.distinct(); return ids == 1 })
	time.Sleep(2*broker.SubscriptionCheck + time.Second)
	if ids, deliveries := tl.distinct(); ids != 1 || deliveries != 1 {
		t.Fatalf("%d messages delivered %d times, want one delivery: the subscription was started again", ids, deliveries)
	}
}
