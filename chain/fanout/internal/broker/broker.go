// Package broker hands batches of split items to workers through RabbitMQ: a
// durable quorum work queue consumed with manual acks, and a dead-letter queue
// for messages delivered too often. It hides amqp091-go and outlives lost
// connections and broker restarts: Publish sends again what the broker has not
// confirmed and Consume subscribes again, so a message may arrive twice but is
// never lost.
package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue names one of the broker's two queues.
type Queue int

const (
	// Items is the work queue, "<prefix>items".
	Items Queue = iota
	// Dead is "<prefix>items.dead", where RabbitMQ moves messages delivered
	// more than MaxRedeliveries times, or nacked without requeue.
	Dead
)

// Options configure a Broker.
type Options struct {
	URL             string       // amqp:// or amqps://
	Prefix          string       // names the queues, e.g. "chaingate."
	MaxRedeliveries int          // x-delivery-limit of the items queue
	Logger          *slog.Logger // nil: discard
}

var (
	// ErrClosed is returned by a Broker's methods once it is closed.
	ErrClosed = errors.New("broker: closed")
	// ErrStale is returned by Ack and Nack on a delivery whose channel is
	// gone: RabbitMQ delivers the message again, so callers may ignore it.
	ErrStale = errors.New("broker: the delivery's channel is gone; RabbitMQ will redeliver it")
	// ErrSettled is returned by a second Ack or Nack of one delivery, which
	// would otherwise make RabbitMQ close the channel and redeliver every
	// message in flight on it.
	ErrSettled = errors.New("broker: delivery already acknowledged or rejected")
)

// TopologyError reports a queue that exists with other arguments than the
// Broker declares, for instance another x-delivery-limit. Retrying cannot fix
// it: the queue has to be deleted, or another prefix used.
type TopologyError struct {
	Queue  string
	Reason string // RabbitMQ's, naming the argument that differs
}

func (e *TopologyError) Error() string {
	return fmt.Sprintf("RabbitMQ queue %q exists with other arguments (%s): delete it or use another prefix", e.Queue, e.Reason)
}

const (
	dialTimeout      = 5 * time.Second
	handshakeTimeout = 10 * time.Second
	minBackoff       = 100 * time.Millisecond
	maxBackoff       = 5 * time.Second
)

// Broker is a client of RabbitMQ that makes its connections again on demand
// once lost. Its methods are safe for concurrent use.
type Broker struct {
	url    string
	addr   string // host:port, for messages: the URL holds the password
	prefix string
	names  [2]string
	args   [2]amqp.Table
	log    *slog.Logger

	// Publishing and consuming use connections of their own, as RabbitMQ
	// advises: during a memory or disk alarm it stops reading from
	// connections that publish, and consumers there could not ack the
	// messages whose removal would end the alarm.
	pubConn, subConn *link

	pubLock chan struct{} // guards pub
	pub     *publisher

	closed    chan struct{}
	closeOnce sync.Once
}

// Open connects to RabbitMQ and declares the queues. Unlike later
// reconnections, a first connection that fails is an error.
func Open(ctx context.Context, opts Options) (*Broker, error) {
	uri, err := amqp.ParseURI(opts.URL)
	if err != nil {
		// A *url.Error quotes the whole URL, password included.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("parsing RabbitMQ URL: %w", err)
	}
	if opts.MaxRedeliveries < 0 {
		return nil, fmt.Errorf("opening RabbitMQ broker: MaxRedeliveries is %d, must be at least 0", opts.MaxRedeliveries)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	items, dead := opts.Prefix+"items", opts.Prefix+"items.dead"
	addr := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	b := &Broker{
		url:    opts.URL,
		addr:   addr,
		prefix: opts.Prefix,
		names:  [2]string{Items: items, Dead: dead},
		args: [2]amqp.Table{
			Items: {
				"x-queue-type":              amqp.QueueTypeQuorum,
				"x-delivery-limit":          int64(opts.MaxRedeliveries),
				"x-dead-letter-exchange":    "",
				"x-dead-letter-routing-key": dead,
				"x-dead-letter-strategy":    "at-least-once",
				// At-least-once dead-lettering needs it, or falls back to at-most-once.
				"x-overflow": "reject-publish",
			},
			Dead: {"x-queue-type": amqp.QueueTypeQuorum},
		},
		log:     log.With("addr", addr),
		pubLock: make(chan struct{}, 1),
		closed:  make(chan struct{}),
	}
	b.pubConn, b.subConn = b.link("publishing"), b.link("consuming")
	c, err := b.pubConn.connection(ctx)
	if err != nil {
		return nil, err
	}
	if err := b.declare(ctx, c); err != nil {
		_ = b.pubConn.close()
		return nil, err
	}
	return b, nil
}

// Close closes the connections; deliveries not acknowledged go back to their
// queue, and Publish and Consume calls in progress return ErrClosed.
func (b *Broker) Close() error {
	var err error
	b.closeOnce.Do(func() {
		close(b.closed)
		if err = errors.Join(b.pubConn.close(), b.subConn.close()); err != nil {
			err = fmt.Errorf("closing RabbitMQ connections: %w", err)
		}
	})
	return err
}

// Depth returns how many messages wait in q, not counting those delivered
// and not yet acknowledged. A connection that closes under it (RabbitMQ
// closed it, or a consumer's shutdown raced it) is dialled again, a few
// times, as a measurement is worth waiting for.
func (b *Broker) Depth(ctx context.Context, q Queue) (int, error) {
	for attempt := 1; ; attempt++ {
		n, err := b.depth(ctx, q)
		// A connection the server closed shows as amqp.ErrClosed, or, when
		// the socket went first, as net.ErrClosed; the client notices a
		// moment later, so the next try waits that moment. A channel number
		// opened again while the server still closes its last use is a
		// connection error (504) that closes the connection too: the next
		// try is on the one that replaces it.
		var ae *amqp.Error
		closed := errors.Is(err, amqp.ErrClosed) || errors.Is(err, net.ErrClosed) || (errors.As(err, &ae) && ae.Code == amqp.ChannelError)
		if err == nil || !closed || attempt == 3 || ctx.Err() != nil {
			return n, err
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}

func (b *Broker) depth(ctx context.Context, q Queue) (int, error) {
	c, err := b.subConn.connection(ctx)
	if err != nil {
		return 0, fmt.Errorf("measuring RabbitMQ queue %q: %w", b.names[q], err)
	}
	ch, err := c.Channel()
	if err != nil {
		return 0, fmt.Errorf("measuring RabbitMQ queue %q: opening a channel: %w", b.names[q], err)
	}
	defer ch.Close()
	defer context.AfterFunc(ctx, func() { _ = ch.Close() })()
	st, err := ch.QueueDeclarePassive(b.names[q], true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("measuring RabbitMQ queue %q: %w", b.names[q], ctxErr(ctx, err))
	}
	return st.Messages, nil
}

func (b *Broker) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// declare declares both queues, the dead one first so that dead-lettering
// always has a target. It uses a channel of its own, which a failed
// declaration closes.
func (b *Broker) declare(ctx context.Context, c *amqp.Connection) error {
	ch, err := c.Channel()
	if err != nil {
		return fmt.Errorf("declaring RabbitMQ queues: opening a channel: %w", err)
	}
	defer ch.Close()
	defer context.AfterFunc(ctx, func() { _ = ch.Close() })()
	for _, q := range []Queue{Dead, Items} {
		if _, err := ch.QueueDeclare(b.names[q], true, false, false, false, b.args[q]); err != nil {
			if ae := (*amqp.Error)(nil); errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
				return &TopologyError{Queue: b.names[q], Reason: ae.Reason}
			}
			return fmt.Errorf("declaring RabbitMQ queue %q: %w", b.names[q], ctxErr(ctx, err))
		}
	}
	return nil
}

// ctxErr prefers ctx's error to err, which may only be the closing of a
// channel or connection that ctx ending caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// permanent reports errors that retrying cannot end. (Not those of a context,
// as a network timeout is one.)
func permanent(err error) bool {
	var te *TopologyError
	return errors.As(err, &te) || errors.Is(err, ErrClosed)
}

// retry paces and logs one Publish or Consume loop's attempts. The loss of
// the connection is logged once by the Broker; a loop logs the failures it
// meets on a live connection, such as a cancelled consumer, the first at Warn
// and the rest at Debug, and says at Info when it works again.
type retry struct {
	b       *Broker
	what    string
	backoff time.Duration
	warned  bool
}

// failed logs err and waits before the next attempt. c is the connection
// the attempt used, nil if it got none.
func (r *retry) failed(ctx context.Context, c *amqp.Connection, err error) error {
	switch {
	case c == nil || c.IsClosed() || r.warned:
		r.b.log.Debug(r.what+": retrying", "err", err)
	default:
		r.warned = true
		r.b.log.Warn(r.what+": retrying", "err", err)
	}
	r.backoff = min(max(2*r.backoff, minBackoff), maxBackoff)
	t := time.NewTimer(r.backoff)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.b.closed:
		return ErrClosed
	}
}

// ok resets the backoff after progress.
func (r *retry) ok() {
	r.backoff = 0
	if r.warned {
		r.warned = false
		r.b.log.Info(r.what + ": working again")
	}
}

// lock takes a one-slot channel used as a mutex, unless ctx ends first.
func lock(ctx context.Context, l chan struct{}) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
