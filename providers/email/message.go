package email

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"sort"
	"strings"
	"time"
)

type payload struct {
	To      json.RawMessage   `json:"to"`
	CC      json.RawMessage   `json:"cc"`
	BCC     json.RawMessage   `json:"bcc"`
	ReplyTo json.RawMessage   `json:"reply_to"`
	Subject string            `json:"subject"`
	Text    string            `json:"text"`
	HTML    string            `json:"html"`
	Headers map[string]string `json:"headers"`
}

// message is what one send submits.
type message struct {
	id       string   // the Message-ID, angle brackets included
	envelope []string // RCPT TO addresses: to, cc and bcc without repeats
	data     []byte   // CRLF line endings; dot-stuffing is the SMTP writer's
}

// ownedHeaders are the header fields the provider writes itself; a payload
// setting one would make a malformed or misleading message.
var ownedHeaders = map[string]bool{
	"date": true, "from": true, "sender": true, "to": true, "cc": true, "bcc": true,
	"reply-to": true, "subject": true, "message-id": true, "mime-version": true,
	"auto-submitted": true, "x-chaingate-dedup-key": true, "return-path": true,
}

// maxIDLeft bounds the left part of a Message-ID: some mail stores cut
// Message-IDs at 250 characters or so, which would break their identity.
const maxIDLeft = 200

// lineLimit is where header fields are folded when they have a space to
// fold at: RFC 2047 (section 2) limits lines holding encoded-words to 76
// characters, stricter than RFC 5322's 78.
const lineLimit = 76

func buildMessage(from *mail.Address, pl payload, dedupKey string, now time.Time) (*message, error) {
	var lists [4][]*mail.Address
	for i, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"to", pl.To}, {"cc", pl.CC}, {"bcc", pl.BCC}, {"reply_to", pl.ReplyTo}} {
		addrs, err := addressList(f.raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		lists[i] = addrs
	}
	to, cc, bcc, replyTo := lists[0], lists[1], lists[2], lists[3]
	msg := &message{id: messageID(dedupKey, from.Address)}
	seen := make(map[string]bool)
	for _, a := range append(append(append([]*mail.Address(nil), to...), cc...), bcc...) {
		if k := strings.ToLower(a.Address); !seen[k] {
			seen[k] = true
			msg.envelope = append(msg.envelope, a.Address)
		}
	}
	if len(msg.envelope) == 0 {
		return nil, errors.New("no recipient: to, cc and bcc are all empty")
	}
	if pl.Text == "" && pl.HTML == "" {
		return nil, errors.New("text or html is required")
	}
	extra, err := extraHeaders(pl.Headers)
	if err != nil {
		return nil, err
	}

	var b bytes.Buffer
	writeField(&b, "Date", now.UTC().Format(time.RFC1123Z))
	writeField(&b, "From", from.String())
	for _, f := range []struct {
		name  string
		addrs []*mail.Address
	}{{"To", to}, {"Cc", cc}, {"Reply-To", replyTo}} {
		if len(f.addrs) > 0 {
			writeField(&b, f.name, joinAddresses(f.addrs))
		}
	}
	if s := subjectText(pl.Subject); s != "" {
		writeField(&b, "Subject", encodeText(s))
	}
	writeField(&b, "Message-ID", msg.id)
	if dedupKey != "" {
		writeField(&b, "X-Chaingate-Dedup-Key", encodeText(dedupKey))
	}
	// Alerts must not set off vacation replies (RFC 3834).
	writeField(&b, "Auto-Submitted", "auto-generated")
	for _, h := range extra {
		writeField(&b, h[0], encodeText(h[1]))
	}
	writeField(&b, "MIME-Version", "1.0")
	if err := writeBody(&b, pl.Text, pl.HTML); err != nil {
		return nil, fmt.Errorf("encoding the body: %w", err)
	}
	msg.data = b.Bytes()
	return msg, nil
}

// addressList reads a string or an array of strings, each holding one
// address or a comma-separated list, so that a template may render either.
// Empty strings and null add nothing.
func addressList(raw json.RawMessage) ([]*mail.Address, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var items []string
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		items = []string{s}
	} else if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("want a string or an array of strings")
	}
	var out []*mail.Address
	for _, s := range items {
		if strings.TrimSpace(s) == "" {
			continue
		}
		addrs, err := mail.ParseAddressList(s)
		if err != nil {
			return nil, fmt.Errorf("parsing %q: %w", s, err)
		}
		for _, a := range addrs {
			if err := checkASCII(a.Address); err != nil {
				return nil, err
			}
		}
		out = append(out, addrs...)
	}
	return out, nil
}

func parseAddress(s string) (*mail.Address, error) {
	a, err := mail.ParseAddress(s)
	if err != nil {
		return nil, fmt.Errorf("parsing %q: %w", s, err)
	}
	return a, checkASCII(a.Address)
}

// checkASCII refuses internationalised addresses, which need SMTPUTF8 all
// the way to the recipient's mailbox.
func checkASCII(addr string) error {
	for i := 0; i < len(addr); i++ {
		if addr[i] >= 0x80 {
			return fmt.Errorf("address %q is not ASCII; write its domain in the xn-- form (internationalised local parts are not supported)", addr)
		}
	}
	return nil
}

func joinAddresses(addrs []*mail.Address) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// extraHeaders checks the payload's headers and returns them sorted by name,
// so that the same payload makes the same message.
func extraHeaders(h map[string]string) ([][2]string, error) {
	out := make([][2]string, 0, len(h))
	seen := make(map[string]string, len(h))
	for name, value := range h {
		lower := strings.ToLower(name)
		switch {
		case !validFieldName(name):
			return nil, fmt.Errorf("headers: %q is not a valid header field name", name)
		case ownedHeaders[lower] || strings.HasPrefix(lower, "content-"):
			return nil, fmt.Errorf("headers: %s is set by the email provider and cannot be given", name)
		case seen[lower] != "":
			return nil, fmt.Errorf("headers: %q and %q are the same header", seen[lower], name)
		case strings.ContainsFunc(value, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }):
			return nil, fmt.Errorf("headers: %s has a value holding a control character such as CR or LF", name)
		}
		seen[lower] = name
		out = append(out, [2]string{name, value})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out, nil
}

// validFieldName: printable ASCII but the colon (RFC 5322, section 2.2).
func validFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || c == ':' {
			return false
		}
	}
	return true
}

// subjectText turns line breaks and other control characters into spaces:
// a subject rendered from an alert title is still worth sending.
func subjectText(s string) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s))
}

// encodeText makes an unstructured header value RFC 2047 encoded-words when
// it is not plain ASCII; plain ASCII is left as it is.
func encodeText(s string) string {
	return mime.QEncoding.Encode("utf-8", s)
}

// writeField writes one header field, folded before spaces so that lines
// stay within lineLimit where the value allows; a long first word goes on
// a line of its own. Never folding before an empty word keeps every
// continuation line non-blank.
func writeField(b *bytes.Buffer, name, value string) {
	b.WriteString(name)
	b.WriteByte(':')
	n := len(name) + 1
	for _, word := range strings.Split(value, " ") {
		if word != "" && n+1+len(word) > lineLimit {
			b.WriteString("\r\n")
			n = 0
		}
		b.WriteByte(' ')
		b.WriteString(word)
		n += 1 + len(word)
	}
	b.WriteString("\r\n")
}

func writeBody(b *bytes.Buffer, text, html string) error {
	if text == "" || html == "" {
		typ := "text/plain"
		if html != "" {
			typ, text = "text/html", html
		}
		writeField(b, "Content-Type", mime.FormatMediaType(typ, map[string]string{"charset": "utf-8"}))
		writeField(b, "Content-Transfer-Encoding", "quoted-printable")
		b.WriteString("\r\n")
		return writeQP(b, text)
	}
	mw := multipart.NewWriter(b)
	writeField(b, "Content-Type", mime.FormatMediaType("multipart/alternative", map[string]string{"boundary": mw.Boundary()}))
	b.WriteString("\r\n")
	// The last alternative is the preferred one (RFC 2046, section 5.1.4).
	for _, part := range [][2]string{{"text/plain", text}, {"text/html", html}} {
		w, err := mw.CreatePart(textproto.MIMEHeader{
			"Content-Type":              {mime.FormatMediaType(part[0], map[string]string{"charset": "utf-8"})},
			"Content-Transfer-Encoding": {"quoted-printable"},
		})
		if err != nil {
			return err
		}
		if err := writeQP(w, part[1]); err != nil {
			return err
		}
	}
	return mw.Close()
}

func writeQP(w io.Writer, s string) error {
	qp := quotedprintable.NewWriter(w)
	if _, err := qp.Write([]byte(s)); err != nil {
		return err
	}
	return qp.Close()
}

// messageID derives the Message-ID from the step's dedup key, so that every
// attempt of a step, and a replay of it, carries the same one:
//
//	<LEFT@DOMAIN>
//
// DOMAIN is the from address's domain, lowercased. LEFT is the dedup key
// with every byte other than A-Z, a-z, 0-9, '-', '_' and '/' written as %XX
// (uppercase hex), which is reversible and always a valid dot-atom. A LEFT
// longer than maxIDLeft becomes "sha256=" and the hex SHA-256 of the key;
// with no dedup key it is "rand=" and 26 random base32 characters. Neither prefix
// can come out of the escaping, which always escapes '='.
func messageID(dedupKey, from string) string {
	domain := strings.ToLower(from[strings.LastIndexByte(from, '@')+1:])
	if dedupKey == "" {
		return "<rand=" + rand.Text() + "@" + domain + ">"
	}
	var b strings.Builder
	for i := 0; i < len(dedupKey); i++ {
		c := dedupKey[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '/' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	left := b.String()
	if len(left) > maxIDLeft {
		sum := sha256.Sum256([]byte(dedupKey))
		left = "sha256=" + hex.EncodeToString(sum[:])
	}
	return "<" + left + "@" + domain + ">"
}
