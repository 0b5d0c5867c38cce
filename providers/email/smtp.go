package email

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/textproto"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/chaingate/gateway/providers"
)

// quitGrace bounds the wait for the answer to QUIT: by then the message is
// accepted or refused, and a slow goodbye must not hold the step.
const quitGrace = 2 * time.Second

// send submits data to set.addr for the recipients in rcpts and returns the
// server's reply to the end of DATA, such as "250 2.0.0 Ok: queued as 4F2".
func send(ctx context.Context, set *settings, rcpts []string, data []byte) (string, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", set.addr)
	if err != nil {
		return "", classify(ctx, "dialling "+set.addr, err)
	}
	// The client's own timeouts are per command; closing the connection
	// when ctx is done unblocks whatever a stalled server holds up, and the
	// deadline keeps every command within the call's.
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	defer stop()
	defer raw.Close()
	conn := net.Conn(raw)
	if deadline, ok := ctx.Deadline(); ok {
		conn = &boundedConn{Conn: raw, limit: deadline}
		if err := conn.SetDeadline(deadline); err != nil {
			return "", classify(ctx, "setting the deadline of the connection to "+set.addr, err)
		}
	}

	localName := set.localName
	if localName == "" {
		localName = helloName(raw.LocalAddr())
	}
	var c *smtp.Client
	switch set.mode {
	case tlsImplicit:
		tc := tls.Client(conn, set.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			return "", classify(ctx, "handshaking TLS with "+set.addr, err)
		}
		c = smtp.NewClient(tc)
	case tlsStartTLS:
		// The client greets with its default name before STARTTLS and with
		// localName after it, when the session that carries the mail begins.
		if c, err = smtp.NewClientStartTLS(conn, set.tls); err != nil {
			if err.Error() == noStartTLS {
				return "", providers.Permanent("starttls_unavailable",
					"%s does not offer STARTTLS; refusing to send in clear text (use tls = \"implicit\" for a port such as 465, or tls = \"none\" only for a trusted local relay)", set.addr)
			}
			return "", classify(ctx, "starting TLS with "+set.addr, err)
		}
	default:
		c = smtp.NewClient(conn)
	}
	defer func() {
		if ctx.Err() == nil {
			c.CommandTimeout = quitGrace
			_ = c.Quit() // the outcome is already known
		}
		_ = c.Close()
	}()
	if err := c.Hello(localName); err != nil {
		return "", classify(ctx, "greeting "+set.addr, err)
	}
	if set.username != "" {
		if err := authenticate(ctx, c, set); err != nil {
			return "", err
		}
	}

	if err := c.Mail(set.from.Address, nil); err != nil {
		return "", classify(ctx, fmt.Sprintf("sending MAIL FROM:<%s> to %s", set.from.Address, set.addr), err)
	}
	if err := addRecipients(ctx, c, set.addr, rcpts); err != nil {
		return "", err
	}
	reply, err := writeData(c, data)
	if err != nil {
		return "", classify(ctx, "sending the message to "+set.addr, err)
	}
	return reply, nil
}

// noStartTLS is how go-smtp says a server offers no STARTTLS; it exports no
// error for it, so its text is matched (TestErrors pins it).
const noStartTLS = "smtp: server doesn't support STARTTLS"

// boundedConn keeps every deadline the client sets within the call's: the
// client sets one per command and clears it after.
type boundedConn struct {
	net.Conn
	limit time.Time
}

func (b *boundedConn) SetDeadline(t time.Time) error {
	if t.IsZero() || t.After(b.limit) {
		t = b.limit
	}
	return b.Conn.SetDeadline(t)
}

// helloName is the EHLO name when local_name is not set: the host name when
// it is fully qualified, else the address literal of the connection's local
// end, which RFC 5321 (section 4.1.4) asks for when there is no meaningful
// name; a container's host name is rarely one.
func helloName(local net.Addr) string {
	if h, err := os.Hostname(); err == nil && strings.Contains(h, ".") && validHelloName(h) {
		return h
	}
	tcp, ok := local.(*net.TCPAddr)
	if !ok {
		return "localhost"
	}
	ip := tcp.AddrPort().Addr().Unmap()
	if ip.Is4() {
		return "[" + ip.String() + "]"
	}
	return "[IPv6:" + ip.WithZone("").String() + "]"
}

func authenticate(ctx context.Context, c *smtp.Client, set *settings) error {
	ok, mechs := c.Extension("AUTH")
	if !ok {
		return providers.Permanent("auth_unavailable", "%s does not offer AUTH; remove username from the config if the relay needs none", set.addr)
	}
	var a sasl.Client
	switch fields := strings.Fields(strings.ToUpper(mechs)); {
	case slices.Contains(fields, "PLAIN"):
		a = sasl.NewPlainClient("", set.username, set.password)
	case slices.Contains(fields, "LOGIN"):
		a = &loginAuth{username: set.username, password: set.password}
	default:
		return providers.Permanent("auth_unsupported", "%s offers AUTH %s; the email provider speaks only PLAIN and LOGIN", set.addr, mechs)
	}
	if err := c.Auth(a); err != nil {
		return classify(ctx, fmt.Sprintf("authenticating as %q with %s", set.username, set.addr), err)
	}
	return nil
}

// addRecipients offers every recipient before giving up, so that the error
// names all that were refused. Any permanent refusal makes the call
// permanent: retrying cannot deliver to that address.
func addRecipients(ctx context.Context, c *smtp.Client, addr string, rcpts []string) error {
	var refused []string
	var first, firstPermanent *providers.Error
	for _, r := range rcpts {
		err := c.Rcpt(r, nil)
		if err == nil {
			continue
		}
		var smtpErr *smtp.SMTPError
		if !errors.As(err, &smtpErr) {
			// The connection is gone; no later recipient can be tried.
			return classify(ctx, fmt.Sprintf("sending RCPT TO:<%s> to %s", r, addr), err)
		}
		pe := replyError(smtpErr)
		refused = append(refused, fmt.Sprintf("<%s>: %s", r, pe.Message))
		if first == nil {
			first = pe
		}
		if firstPermanent == nil && !pe.Retryable {
			firstPermanent = pe
		}
	}
	if first == nil {
		return nil
	}
	pe := first
	if firstPermanent != nil {
		pe = firstPermanent
	}
	pe.Message = fmt.Sprintf("%s refused %d of %d recipients, nothing was sent: %s", addr, len(refused), len(rcpts), strings.Join(refused, "; "))
	return pe
}

// writeData sends the message itself and returns the server's final
// reply, which holds the queue id that ties the message to the relay's logs.
func writeData(c *smtp.Client, data []byte) (string, error) {
	w, err := c.Data()
	if err != nil {
		return "", err
	}
	if _, err := w.Write(data); err != nil {
		return "", err
	}
	resp, err := w.CloseWithResponse()
	if err != nil {
		return "", err
	}
	return formatReply(250, resp.StatusText), nil
}

// formatReply writes a reply as the server sent it, its lines joined, for
// messages and logs; a server's text
// is not trusted to be free of control characters.
func formatReply(code int, msg string) string {
	return fmt.Sprintf("%03d %s", code, strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, msg))
}

// classify turns a failure in stage into a providers.Error with its class.
func classify(ctx context.Context, stage string, err error) error {
	var smtpErr *smtp.SMTPError
	var certErr *tls.CertificateVerificationError
	var recErr tls.RecordHeaderError
	var protoErr textproto.ProtocolError
	switch {
	case ctx.Err() != nil:
		// The gateway gave up on the call; its own error says why.
		return fmt.Errorf("%s: %w", stage, ctx.Err())
	case errors.As(err, &smtpErr):
		pe := replyError(smtpErr)
		pe.Message = fmt.Sprintf("%s: %s", stage, pe.Message)
		if smtpErr.Code == 535 {
			pe.Message += " (check the username and password)"
		}
		return pe
	case errors.As(err, &certErr):
		return &providers.Error{Code: "tls_certificate", Message: fmt.Sprintf("%s: %v (trust a private CA with ca_file, or set server_name to the name in the certificate)", stage, err), Err: err}
	case errors.As(err, &recErr):
		return &providers.Error{Code: "tls", Message: fmt.Sprintf("%s: the server does not speak TLS here (tls = \"implicit\" on a STARTTLS or plain port?): %v", stage, err), Err: err}
	case errors.As(err, &protoErr):
		return &providers.Error{Code: "smtp_protocol", Message: fmt.Sprintf("%s: not an SMTP server, or not at this port: %v", stage, err), Err: err}
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The connection's deadline is the context's, reached a moment
		// before the context notices.
		return fmt.Errorf("%s: %w", stage, context.DeadlineExceeded)
	default:
		return &providers.Error{Retryable: true, Code: "network", Message: fmt.Sprintf("%s: %v", stage, err), Err: err}
	}
}

// replyError classes an SMTP reply: 4xx is transient by definition
// (RFC 5321, section 4.2.1); 5xx, and any reply the client did not expect,
// will not change on a retry. The message is the reply as the server sent
// it, enhanced status code included.
func replyError(e *smtp.SMTPError) *providers.Error {
	msg := e.Message
	if e.EnhancedCode != smtp.EnhancedCodeNotSet && e.EnhancedCode != smtp.NoEnhancedCode {
		msg = fmt.Sprintf("%d.%d.%d %s", e.EnhancedCode[0], e.EnhancedCode[1], e.EnhancedCode[2], msg)
	}
	return &providers.Error{
		Retryable: e.Code >= 400 && e.Code < 500,
		Code:      fmt.Sprintf("smtp_%03d", e.Code),
		Message:   formatReply(e.Code, msg),
		Err:       e,
	}
}

// loginAuth is AUTH LOGIN, the only mechanism some relays offer. It answers
// the server's prompts by what they ask, where go-sasl's sends the name
// unasked and expects the password prompt word for word.
type loginAuth struct{ username, password string }

func (a *loginAuth) Start() (string, []byte, error) { return "LOGIN", nil, nil }

func (a *loginAuth) Next(challenge []byte) ([]byte, error) {
	switch strings.ToLower(strings.TrimSpace(string(challenge))) {
	case "username:", "user name", "username":
		return []byte(a.username), nil
	case "password:", "password":
		return []byte(a.password), nil
	}
	return nil, fmt.Errorf("unexpected server challenge %q to AUTH LOGIN", challenge)
}
