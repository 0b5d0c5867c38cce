package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// link is one of a Broker's connections, made again on demand once lost.
type link struct {
	b    *Broker
	name string // "publishing" or "consuming"
	log  *slog.Logger

	lock chan struct{} // guards conn; a channel so that waiting for it ends with ctx
	conn *conn         // nil until first needed

	mu   sync.Mutex
	down bool // the connection was lost and that was logged; "reconnected" is due
}

type conn struct {
	*amqp.Connection
	lost chan struct{} // closed once the connection is gone and its loss logged
}

func (b *Broker) link(name string) *link {
	return &link{b: b, name: name, log: b.log.With("connection", name), lock: make(chan struct{}, 1)}
}

// connection returns the open connection, making a new one if there is
// none. It makes one attempt: callers retry with backoff.
func (l *link) connection(ctx context.Context) (*amqp.Connection, error) {
	if err := lock(ctx, l.lock); err != nil {
		return nil, err
	}
	defer func() { <-l.lock }()
	if l.b.isClosed() {
		return nil, ErrClosed
	}
	if l.conn != nil {
		if !l.conn.IsClosed() {
			return l.conn.Connection, nil
		}
		// The loss is logged before any "reconnected".
		select {
		case <-l.conn.lost:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c, err := l.dial(ctx)
	if err != nil {
		return nil, err
	}
	l.conn = c
	l.mu.Lock()
	if l.down {
		l.down = false
		l.log.Info("reconnected to RabbitMQ")
	}
	l.mu.Unlock()
	return c.Connection, nil
}

// dial makes a connection and watches it, to log its loss and RabbitMQ
// blocking it.
func (l *link) dial(ctx context.Context) (*conn, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("chaingate " + l.b.prefix + " " + l.name)
	stop := func() bool { return true }
	ac, err := amqp.DialConfig(l.b.url, amqp.Config{
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: dialTimeout}
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The AMQP handshake is not context-aware: bound it, and end it
			// with ctx. The library clears the deadline once it is done.
			if err := nc.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
				_ = nc.Close()
				return nil, err
			}
			stop = context.AfterFunc(ctx, func() { _ = nc.Close() })
			return nc, nil
		},
	})
	if !stop() && err == nil {
		_ = ac.Close()
		err = ctx.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to RabbitMQ at %s: %w", l.b.addr, ctxErr(ctx, err))
	}
	c := &conn{Connection: ac, lost: make(chan struct{})}
	closes := ac.NotifyClose(make(chan *amqp.Error, 1))
	blocks := ac.NotifyBlocked(make(chan amqp.Blocking, 1))
	go func() {
		defer close(c.lost)
		for {
			select {
			case bl, ok := <-blocks:
				switch {
				case !ok:
					blocks = nil
				case bl.Active:
					l.log.Warn("RabbitMQ blocks publishing until an alarm clears", "reason", bl.Reason)
				default:
					l.log.Info("RabbitMQ unblocked publishing")
				}
			case e := <-closes:
				if e != nil {
					l.mu.Lock()
					if !l.down {
						l.down = true
						l.log.Warn("lost the connection to RabbitMQ; reconnecting", "reason", e.Error())
					}
					l.mu.Unlock()
				}
				return
			}
		}
	}()
	return c, nil
}

func (l *link) close() error {
	l.lock <- struct{}{}
	defer func() { <-l.lock }()
	if l.conn == nil || l.conn.IsClosed() {
		return nil
	}
	if err := l.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return err
	}
	return nil
}
