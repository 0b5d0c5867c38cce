package broker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Delivery is a message received from a queue, to acknowledge with Ack or
// Nack.
type Delivery struct {
	Body        []byte
	Headers     map[string]any
	Redelivered bool
	// DeliveryCount is the quorum queue's x-delivery-count: how many times
	// the message was delivered and returned before; 0 on a first delivery.
	DeliveryCount int

	ch      *amqp.Channel
	tag     uint64
	settled atomic.Bool
}

// Ack acknowledges the delivery: RabbitMQ forgets the message. It may be
// called from any goroutine.
func (d *Delivery) Ack() error {
	return d.settle(func() error { return d.ch.Ack(d.tag, false) })
}

// Nack rejects the delivery: with requeue, RabbitMQ delivers the message
// again, until it has been delivered more than MaxRedeliveries times; without,
// it moves the message to the Dead queue at once. It may be called from any
// goroutine.
func (d *Delivery) Nack(requeue bool) error {
	return d.settle(func() error { return d.ch.Nack(d.tag, false, requeue) })
}

func (d *Delivery) settle(send func() error) error {
	if !d.settled.CompareAndSwap(false, true) {
		return ErrSettled
	}
	// A send fails only on a closed channel, or on a write error, which
	// closes the connection.
	if err := send(); err != nil {
		return fmt.Errorf("%w: %v", ErrStale, err)
	}
	return nil
}

// Consume delivers the messages of q to handle, at most prefetch of them
// unacknowledged at a time, until ctx ends; it then returns nil. It
// subscribes again, the queues declared anew, after losing its connection or
// channel or having its consumer cancelled (the queue was deleted, or its
// node is stopping), with a backoff of 100 ms doubling to 5 s; RabbitMQ
// redelivers what the lost channel delivered and was not acknowledged. It
// returns an error only for a *TopologyError or once the Broker is closed.
// handle runs on Consume's goroutine and must not block long: hand slow work
// to other goroutines, which may acknowledge the deliveries.
func (b *Broker) Consume(ctx context.Context, q Queue, prefetch int, handle func(*Delivery)) error {
	if prefetch < 1 {
		return fmt.Errorf("consuming from RabbitMQ queue %q: prefetch is %d, must be at least 1", b.names[q], prefetch)
	}
	r := retry{b: b, what: "consuming from RabbitMQ queue " + b.names[q]}
	for {
		c, err := b.subConn.connection(ctx)
		if err == nil {
			err = b.consume(ctx, c, q, prefetch, handle, &r)
		}
		if ctx.Err() != nil {
			return nil
		}
		if permanent(err) {
			return fmt.Errorf("consuming from RabbitMQ queue %q: %w", b.names[q], err)
		}
		if err := r.failed(ctx, c, err); err != nil {
			if errors.Is(err, ErrClosed) {
				return fmt.Errorf("consuming from RabbitMQ queue %q: %w", b.names[q], err)
			}
			return nil
		}
	}
}

// consume subscribes once on a channel of its own and delivers until the
// channel or the subscription ends, or ctx does. It says why it ended.
func (b *Broker) consume(ctx context.Context, c *amqp.Connection, q Queue, prefetch int, handle func(*Delivery), r *retry) error {
	if err := b.declare(ctx, c); err != nil {
		return err
	}
	ch, err := c.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel: %w", err)
	}
	defer ch.Close()
	defer context.AfterFunc(ctx, func() { _ = ch.Close() })()
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancels := ch.NotifyCancel(make(chan string, 1))
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("setting the prefetch: %w", err)
	}
	ds, err := ch.Consume(b.names[q], "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("subscribing: %w", err)
	}
	r.ok()
	b.log.Debug("consuming", "queue", b.names[q], "prefetch", prefetch)
	check := time.NewTicker(SubscriptionCheck)
	defer check.Stop()
	for {
		select {
		case <-check.C:
			if err := b.stillSubscribed(c, q); err != nil {
				return err
			}
		case d, ok := <-ds:
			if !ok {
				return ended(closes, cancels)
			}
			handle(&Delivery{
				Body:          d.Body,
				Headers:       plain(d.Headers),
				Redelivered:   d.Redelivered,
				DeliveryCount: deliveryCount(d.Headers),
				ch:            ch,
				tag:           d.DeliveryTag,
			})
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// SubscriptionCheck is how often a consumer makes sure its queue still
// counts it among its consumers.
const SubscriptionCheck = 5 * time.Second

// stillSubscribed looks at q on a channel of its own. A queue deleted while
// a consumer was being subscribed to it can leave that consumer on the old
// queue, never cancelled (RabbitMQ 3.10 with quorum queues), while the queue
// declared anew in its place has no consumer: the subscription must start
// again. A queue that is gone ends it too.
func (b *Broker) stillSubscribed(c *amqp.Connection, q Queue) error {
	ch, err := c.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel to look at the queue: %w", err)
	}
	defer ch.Close()
	info, err := ch.QueueDeclarePassive(b.names[q], true, false, false, false, nil)
	switch {
	case err != nil:
		return fmt.Errorf("looking at the queue: %w", err)
	case info.Consumers == 0:
		return errors.New("the queue counts no consumer: it was deleted and declared anew while this one was subscribed")
	}
	return nil
}

// ended says why a subscription's deliveries stopped.
func ended(closes <-chan *amqp.Error, cancels <-chan string) error {
	select {
	case <-cancels:
		return errors.New("RabbitMQ cancelled the consumer, as it does when the queue is deleted or its node stops")
	case e := <-closes:
		if e != nil {
			return fmt.Errorf("channel closed: %w", e)
		}
	default:
	}
	return errors.New("channel closed")
}

func deliveryCount(h amqp.Table) int {
	switch n := h["x-delivery-count"].(type) {
	case int64:
		return int(n)
	case int32:
		return int(n)
	case int16:
		return int(n)
	case int8:
		return int(n)
	case int:
		return n
	}
	return 0
}

// plain turns AMQP tables, at any depth, into plain maps, so that callers
// read headers such as x-death without knowing the AMQP library's types.
func plain(t amqp.Table) map[string]any {
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = plainValue(v)
	}
	return out
}

func plainValue(v any) any {
	switch x := v.(type) {
	case amqp.Table:
		return plain(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plainValue(e)
		}
		return out
	}
	return v
}
