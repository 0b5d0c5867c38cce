package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Message is one message for the items queue.
type Message struct {
	Headers map[string]any // AMQP table values: string, int64, bool, []any ...
	Body    []byte
}

// Publish sends msgs to the items queue as persistent messages, all at once,
// and returns when RabbitMQ has confirmed every one, or with an error when
// ctx ends first. Whatever is not confirmed — the connection or channel was
// lost, the broker nacked it, or returned it because the queue was gone — is
// sent again after a backoff (100 ms doubling to 5 s), the queues declared
// anew; so a message may arrive twice, but never zero times. Each message's
// MessageId names its publication, not its content.
//
// Concurrent calls share a channel, each waiting for its own confirms. While
// RabbitMQ blocks publishing (a memory or disk alarm), Publish waits, past
// the end of ctx if it is writing a message.
func (b *Broker) Publish(ctx context.Context, msgs []Message) error {
	for i, m := range msgs {
		// Invalid headers would fail every attempt.
		if err := amqp.Table(m.Headers).Validate(); err != nil {
			return fmt.Errorf("publishing to RabbitMQ: message %d: %w", i, err)
		}
	}
	todo := make([]int, len(msgs))
	for i := range todo {
		todo[i] = i
	}
	r := retry{b: b, what: "publishing to RabbitMQ"}
	redeclare := false // a message came back: the queue is gone
	for len(todo) > 0 {
		var c *amqp.Connection
		p, err := b.publisher(ctx)
		if err == nil {
			c = p.conn
			if redeclare {
				// Declared only after the backoff: a quorum queue declared
				// again within milliseconds of its deletion leaves its
				// consumers subscribed to nothing, never cancelled (RabbitMQ
				// 3.10).
				err = b.declare(ctx, c)
			}
		}
		if err == nil {
			var left []int
			left, err = p.publish(ctx, b.names[Items], msgs, todo)
			if len(left) < len(todo) {
				r.ok()
			}
			todo = left
			redeclare = errors.Is(err, errReturned)
		}
		if len(todo) == 0 {
			break
		}
		if ctx.Err() == nil && !permanent(err) {
			err = r.failed(ctx, c, err)
		}
		if err != nil {
			return fmt.Errorf("publishing to RabbitMQ: %d of %d messages unconfirmed: %w", len(todo), len(msgs), ctxErr(ctx, err))
		}
	}
	return nil
}

var errReturned = errors.New("returned as unroutable: the queue is gone")

// publisher is a channel in confirm mode that Publish calls share.
type publisher struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	ids  string // prefix of message ids, by which returns are matched to confirms

	send sync.Mutex // held from reading the next delivery tag to publishing under it

	mu       sync.Mutex
	pending  map[uint64]waiter   // by delivery tag
	returned map[string]struct{} // message ids returned and not yet confirmed
	gone     error               // why the channel closed; nil while open
}

// waiter is one message waiting for its confirm.
type waiter struct {
	i   int
	res chan<- outcome
}

type outcome struct {
	i   int
	err error // nil: confirmed
}

// publisher returns the open publishing channel, making one if there is none.
func (b *Broker) publisher(ctx context.Context) (*publisher, error) {
	if err := lock(ctx, b.pubLock); err != nil {
		return nil, err
	}
	defer func() { <-b.pubLock }()
	if p := b.pub; p != nil && !p.ch.IsClosed() {
		return p, nil
	}
	c, err := b.pubConn.connection(ctx)
	if err != nil {
		return nil, err
	}
	if err := b.declare(ctx, c); err != nil {
		return nil, err
	}
	ch, err := c.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a channel: %w", err)
	}
	p := &publisher{conn: c, ch: ch, ids: randomHex(8) + "-", pending: map[uint64]waiter{}, returned: map[string]struct{}{}}
	// Unbuffered: the library hands over a message's basic.return before its
	// basic.ack, blocking until run takes it, so run marks the message
	// returned before it settles the ack.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go p.run(confirms, returns, closes)
	stop := context.AfterFunc(ctx, func() { _ = ch.Close() })
	err = ch.Confirm(false)
	if !stop() {
		return nil, ctx.Err()
	}
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("putting the channel in confirm mode: %w", err)
	}
	b.pub = p
	return p, nil
}

// run settles confirms until the channel closes, then fails the messages
// still waiting.
func (p *publisher) run(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	for confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.mu.Lock()
			p.returned[r.MessageId] = struct{}{}
			p.mu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			p.settle(c)
		}
	}
	gone := errors.New("channel closed")
	if e := <-closes; e != nil {
		gone = fmt.Errorf("channel closed: %w", e)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gone = gone
	for tag, w := range p.pending {
		w.res <- outcome{i: w.i, err: gone}
		delete(p.pending, tag)
	}
}

func (p *publisher) settle(c amqp.Confirmation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.pending[c.DeliveryTag]
	if !ok {
		return
	}
	delete(p.pending, c.DeliveryTag)
	id := p.messageID(c.DeliveryTag)
	o := outcome{i: w.i}
	if _, ret := p.returned[id]; ret {
		delete(p.returned, id)
		o.err = errReturned
	} else if !c.Ack {
		o.err = errNacked
	}
	w.res <- o
}

var errNacked = errors.New("nacked by RabbitMQ")

func (p *publisher) messageID(tag uint64) string {
	return p.ids + strconv.FormatUint(tag, 10)
}

// publish sends msgs[i] for each i in todo without waiting in between, then
// waits for their confirms. It returns the indexes not confirmed and why.
func (p *publisher) publish(ctx context.Context, queue string, msgs []Message, todo []int) ([]int, error) {
	res := make(chan outcome, len(todo))
	var left []int
	var err error
	n := 0 // outcomes to wait for
	for k, i := range todo {
		var settles bool
		settles, err = p.publishOne(ctx, queue, i, msgs[i], res)
		if settles {
			n++
		}
		if err != nil {
			from := k + 1
			if !settles {
				from = k
			}
			left = append(left, todo[from:]...)
			break
		}
	}
	for ; n > 0; n-- {
		select {
		case o := <-res:
			if o.err != nil {
				left = append(left, o.i)
				// A return calls for declaring the queues again, whatever
				// else went wrong.
				if err == nil || errors.Is(o.err, errReturned) {
					err = o.err
				}
			}
		case <-ctx.Done():
			return todo, ctx.Err()
		}
	}
	return left, err
}

// publishOne publishes m under the next delivery tag and reports whether its
// outcome will come on res.
func (p *publisher) publishOne(ctx context.Context, queue string, i int, m Message, res chan<- outcome) (bool, error) {
	p.send.Lock()
	defer p.send.Unlock()
	tag := p.ch.GetNextPublishSeqNo()
	p.mu.Lock()
	if p.gone != nil {
		p.mu.Unlock()
		return false, p.gone
	}
	p.pending[tag] = waiter{i: i, res: res}
	p.mu.Unlock()
	err := p.ch.PublishWithContext(ctx, "", queue, true, false, amqp.Publishing{
		Headers:      m.Headers,
		DeliveryMode: amqp.Persistent,
		MessageId:    p.messageID(tag),
		Body:         m.Body,
	})
	if err == nil {
		return true, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pending[tag]; !ok {
		return true, err // run failed it already, as the channel closed
	}
	delete(p.pending, tag)
	return false, err
}
