package ssh

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"

	xssh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// hostKeyCheck returns the check of the keys hosts offer, known_hosts read
// afresh so that an edit applies to the next connection.
func (s *settings) hostKeyCheck(log *slog.Logger) (xssh.HostKeyCallback, error) {
	if s.cfg.InsecureIgnoreHostKey {
		return func(addr string, _ net.Addr, key xssh.PublicKey) error {
			log.Warn("ssh: connecting without checking the host key, as insecure_ignore_host_key = true; anyone between the gateway and the host could answer for it",
				"host", addr, "key_type", key.Type(), "fingerprint", xssh.FingerprintSHA256(key))
			return nil
		}, nil
	}
	var known xssh.HostKeyCallback
	if s.cfg.KnownHosts != "" {
		var err error
		if known, err = knownhosts.New(s.cfg.KnownHosts); err != nil {
			return nil, fmt.Errorf("reading known_hosts: %w", err)
		}
	}
	return func(addr string, remote net.Addr, key xssh.PublicKey) error {
		for _, pin := range s.pins {
			if bytes.Equal(pin.Marshal(), key.Marshal()) {
				return nil
			}
		}
		refused := &hostKeyError{addr: addr, offered: key, file: s.cfg.KnownHosts, pins: s.pins}
		if known == nil {
			return refused
		}
		err := known(addr, remote, key)
		var keyErr *knownhosts.KeyError
		var revoked *knownhosts.RevokedError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &keyErr):
			refused.known = keyErr.Want
		case errors.As(err, &revoked):
			refused.revoked = true
		default:
			refused.err = err
		}
		return refused
	}, nil
}

// hostKeyError is a host's key refused.
type hostKeyError struct {
	addr    string
	offered xssh.PublicKey
	file    string // the known_hosts checked, if any
	// known are the keys known_hosts holds for the host.
	known   []knownhosts.KnownKey
	revoked bool
	pins    []xssh.PublicKey
	err     error // known_hosts failing otherwise
}

// code classes the refusal: a host no key is on record for, or one whose
// key differs from the record, which is what an attack looks like.
func (e *hostKeyError) code() string {
	switch {
	case e.revoked:
		return "host_key_revoked"
	case len(e.known) > 0 || len(e.pins) > 0:
		return "host_key_mismatch"
	}
	return "host_key_unknown"
}

func (e *hostKeyError) Error() string {
	var checked []string
	switch {
	case e.file == "":
	case e.revoked:
		checked = append(checked, "known_hosts "+e.file+" marks that key @revoked")
	case e.err != nil:
		checked = append(checked, fmt.Sprintf("checking known_hosts %s failed: %v", e.file, e.err))
	case len(e.known) > 0:
		var keys []string
		for _, k := range e.known {
			keys = append(keys, fmt.Sprintf("%s %s (line %d)", k.Key.Type(), xssh.FingerprintSHA256(k.Key), k.Line))
		}
		checked = append(checked, fmt.Sprintf("known_hosts %s holds %s for it", e.file, strings.Join(keys, ", ")))
	default:
		checked = append(checked, "known_hosts "+e.file+" has no entry for it")
	}
	switch len(e.pins) {
	case 0:
	case 1:
		checked = append(checked, "it is not the key pinned in host_keys")
	default:
		checked = append(checked, fmt.Sprintf("it is none of the %d keys pinned in host_keys", len(e.pins)))
	}
	msg := fmt.Sprintf("refusing %s: it offered the %s key %s; %s", e.addr, e.offered.Type(), xssh.FingerprintSHA256(e.offered), strings.Join(checked, "; "))
	switch e.code() {
	case "host_key_mismatch":
		msg += ". If the host was reinstalled, update its key; otherwise something may stand between the gateway and the host"
	case "host_key_unknown":
		msg += ". Add the host's key (ssh-keyscan, checked out of band) to known_hosts or host_keys"
	}
	return msg
}

// algorithms are the host key algorithms to ask for again when the host
// offered a key of a type nothing on record has: a server with keys of
// several types, or a certificate too, offers the one the client prefers,
// which need not be the one on record. Nil when asking again cannot help.
func (e *hostKeyError) algorithms() []string {
	var types []string
	for _, k := range e.known {
		types = append(types, k.Key.Type())
	}
	for _, k := range e.pins {
		types = append(types, k.Type())
	}
	_, cert := e.offered.(*xssh.Certificate)
	switch {
	case e.revoked || slices.Contains(types, e.offered.Type()):
		return nil
	case len(types) == 0 && cert:
		// A certificate no @cert-authority line vouches for, which
		// hides what known_hosts holds for the host's plain key.
		var plain []string
		for _, a := range xssh.SupportedAlgorithms().HostKeys {
			if !strings.Contains(a, "-cert-") {
				plain = append(plain, a)
			}
		}
		return plain
	case len(types) == 0:
		return nil
	}
	var algos []string
	for _, t := range types {
		if t == xssh.KeyAlgoRSA {
			// An RSA key signs with SHA-2 unless the server is old.
			algos = append(algos, xssh.KeyAlgoRSASHA512, xssh.KeyAlgoRSASHA256)
		}
		algos = append(algos, t)
	}
	slices.Sort(algos)
	return slices.Compact(algos)
}
