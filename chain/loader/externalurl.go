package loader

import (
	"errors"
	"net/url"
	"strings"
	"unicode"

	"github.com/chaingate/gateway/chain"
)

// externalURL reads [gateway] external_url: an absolute http(s) URL with
// a host and nothing a link could not be built on (a query, a fragment,
// credentials). A trailing slash is dropped, so links join it with a path.
func (t *table) externalURL(k string) string {
	raw := t.nonEmpty(k)
	if raw == "" {
		return ""
	}
	const want = `want the absolute address people reach the gateway at, e.g. "https://gw.example.com"`
	u, err := url.Parse(raw)
	switch {
	case strings.ContainsFunc(raw, unicode.IsSpace):
		t.d.errorf(t.path.Key(k), "%q holds white space: %s", raw, want)
	case err != nil:
		t.d.errorf(t.path.Key(k), "is not a URL (%v): %s", urlProblem(err), want)
	case u.Scheme != "http" && u.Scheme != "https":
		t.d.errorf(t.path.Key(k), "%q is not an http or https URL: %s", raw, want)
	case u.Host == "" || u.Opaque != "":
		t.d.errorf(t.path.Key(k), "%q has no host: %s", raw, want)
	case u.User != nil:
		t.d.errorf(t.path.Key(k), "%q holds a user name or password, which every link would show: %s", u.Redacted(), want)
	case u.RawQuery != "" || u.ForceQuery:
		t.d.errorf(t.path.Key(k), "%q has a query, which links cannot be built on: %s", raw, want)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		t.d.errorf(t.path.Key(k), "%q has a fragment, which links cannot be built on: %s", raw, want)
	default:
		return strings.TrimRight(raw, "/")
	}
	return ""
}

// urlProblem is what url.Parse found wrong, without the URL it repeats.
func urlProblem(err error) error {
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// runURLRead is a template or condition that reads run.url, which needs
// [gateway] external_url and the console: checked once every file is
// loaded, since the [gateway] table may be in any of them.
type runURLRead struct {
	d    *fileDecoder
	at   chain.KeyPath
	text string
}

// noteRunURL keeps the refs, read at p, that read run.url.
func (l *loader) noteRunURL(d *fileDecoder, p chain.KeyPath, refs []ref) {
	for _, r := range refs {
		if r.root == "run" && len(r.path) > 0 && r.path[0] == "url" {
			l.runURLReads = append(l.runURLReads, runURLRead{d: d, at: p.Sub(r.key), text: r.text})
		}
	}
}

// checkRunURL reports every read of run.url a run could not fill in. A
// stored definition has no [gateway] table: its run reads the gateway's.
func (l *loader) checkRunURL() {
	if l.opts.Stored {
		return
	}
	gw := &l.cfg.Gateway
	var why string
	switch {
	case gw.ExternalURL == "":
		why = `run.url is the run's console page at [gateway] external_url, which is not set: set it to the address people reach the gateway at, e.g. external_url = "https://gw.example.com"`
	case gw.UI.Disabled:
		why = "run.url is the run's console page, and [gateway.ui] enabled = false turns the console off"
	default:
		return
	}
	for _, r := range l.runURLReads {
		r.d.errorf(r.at, "%s: %s", r.text, why)
	}
}
