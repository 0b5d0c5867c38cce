// Command smtpd is the SMTP server the email provider's tests run against:
// a real server process, so that the provider is tested over real TCP, TLS
// and SMTP rather than against a mock of its client.
//
// It prints "listening ADDR" on stdout once it accepts connections, and
// appends every message it accepts to -out as one JSON line. Replies are
// scripted by the local part of an address:
//
//	RCPT TO   tempfail@  451 4.3.0     reject@      550 5.1.1
//	DATA      stall@     never answers datatemp@    452 4.3.1   datareject@ 554 5.6.0
//	MAIL FROM mailtemp@  421 4.3.2     mailreject@  553 5.7.1
package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Record is one accepted message as written to -out.
type Record struct {
	Helo     string   `json:"helo"`
	TLS      bool     `json:"tls"`
	AuthUser string   `json:"auth_user"`
	From     string   `json:"from"`
	To       []string `json:"to"`
	Data     string   `json:"data"`
}

type backend struct {
	user, pass string
	mechs      []string
	queued     atomic.Int64

	mu  sync.Mutex
	out *os.File
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	mode := flag.String("tls", "none", "none, starttls or implicit")
	cert := flag.String("cert", "", "PEM certificate, for -tls starttls or implicit")
	key := flag.String("key", "", "PEM key of -cert")
	user := flag.String("user", "", "require AUTH with this user name")
	pass := flag.String("pass", "", "password of -user")
	mechs := flag.String("mechs", "PLAIN,LOGIN", "AUTH mechanisms to offer")
	out := flag.String("out", "", "file to append accepted messages to, as JSON lines")
	flag.Parse()

	f, err := os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		log.Fatalf("opening -out: %v", err)
	}
	be := &backend{user: *user, pass: *pass, mechs: strings.Split(*mechs, ","), out: f}
	s := smtp.NewServer(be)
	s.Domain = "smtpd.test"
	s.ReadTimeout = time.Minute
	s.WriteTimeout = time.Minute
	s.ErrorLog = log.New(os.Stderr, "smtpd: ", 0)

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listening: %v", err)
	}
	var tlsConfig *tls.Config
	if *mode != "none" {
		pair, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			log.Fatalf("loading the certificate: %v", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{pair}}
	}
	switch *mode {
	case "none":
		s.AllowInsecureAuth = true // the provider decides whether that is safe
	case "starttls":
		s.TLSConfig = tlsConfig
	case "implicit":
		ln = tls.NewListener(ln, tlsConfig)
	default:
		log.Fatalf("-tls %q is not none, starttls or implicit", *mode)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	log.Fatal(s.Serve(ln))
}

func (be *backend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{be: be, conn: c}, nil
}

func (be *backend) write(r Record) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	_, err = be.out.Write(append(line, '\n'))
	return err
}

type session struct {
	be       *backend
	conn     *smtp.Conn
	authUser string
	from     string
	to       []string
}

func (s *session) AuthMechanisms() []string {
	if s.be.user == "" {
		return nil
	}
	return s.be.mechs
}

func (s *session) Auth(mech string) (sasl.Server, error) {
	check := func(user, pass string) error {
		if user != s.be.user || pass != s.be.pass {
			return smtp.ErrAuthFailed
		}
		s.authUser = user
		return nil
	}
	switch {
	case !slices.Contains(s.AuthMechanisms(), mech):
		return nil, smtp.ErrAuthUnknownMechanism
	case mech == sasl.Plain:
		return sasl.NewPlainServer(func(_, user, pass string) error { return check(user, pass) }), nil
	default:
		return &loginServer{check: check}, nil
	}
}

func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	if s.be.user != "" && s.authUser == "" {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "Authentication required"}
	}
	switch local(from) {
	case "mailtemp":
		return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 3, 2}, Message: "Try again later"}
	case "mailreject":
		return &smtp.SMTPError{Code: 553, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "Sender not allowed"}
	}
	s.from = from
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	switch local(to) {
	case "tempfail":
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Mailbox busy, try later"}
	case "reject":
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "No such user"}
	}
	s.to = append(s.to, to)
	return nil
}

func (s *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	for _, to := range s.to {
		switch local(to) {
		case "stall":
			log.Printf("stalling on DATA for %s", to)
			time.Sleep(time.Hour)
		case "datatemp":
			return &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 3, 1}, Message: "Insufficient storage"}
		case "datareject":
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: "Message refused"}
		}
	}
	_, isTLS := s.conn.TLSConnectionState()
	rec := Record{Helo: s.conn.Hostname(), TLS: isTLS, AuthUser: s.authUser, From: s.from, To: s.to, Data: string(data)}
	if err := s.be.write(rec); err != nil {
		return err
	}
	return &smtp.SMTPError{Code: 250, EnhancedCode: smtp.EnhancedCode{2, 0, 0}, Message: fmt.Sprintf("Ok: queued as Q%d", s.be.queued.Add(1))}
}

func (s *session) Reset() {
	s.from, s.to = "", nil
}

func (s *session) Logout() error { return nil }

func local(addr string) string {
	l, _, _ := strings.Cut(addr, "@")
	return l
}

// loginServer is the server side of AUTH LOGIN, which go-sasl lacks.
type loginServer struct {
	check func(user, pass string) error
	user  string
}

func (l *loginServer) Next(response []byte) ([]byte, bool, error) {
	switch {
	case l.user == "" && response == nil:
		return []byte("Username:"), false, nil
	case l.user == "":
		if len(response) == 0 {
			return nil, false, errors.New("empty user name")
		}
		l.user = string(response)
		return []byte("Password:"), false, nil
	default:
		return nil, true, l.check(l.user, string(response))
	}
}
