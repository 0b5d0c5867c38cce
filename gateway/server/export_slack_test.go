package server

import (
	"net/http"
	"net/url"

	"github.com/chaingate/gateway/gateway/approvals"
)

// RespondToSlackAt has s post what came of Slack interactions with client
// to response URLs on host, a test server's, in place of hooks.slack.com.
func RespondToSlackAt(s *Server, client *http.Client, host string) {
	s.slackOut.Store(&approvals.SlackResponder{Client: client, Allowed: func(u *url.URL, _ []string) bool { return u.Host == host }})
}

// RespondToSlackWith has s post what came of Slack interactions with
// client, to the response URLs the config allows.
func RespondToSlackWith(s *Server, client *http.Client) {
	s.slackOut.Store(&approvals.SlackResponder{Client: client, Allowed: approvals.DefaultSlackResponder.Allowed})
}

// SlackResponseURLAllowed reports whether a gateway whose [gateway.slack]
// response_url_hosts is hosts (nil: unset) posts a Slack reply to the
// response URL raw.
func SlackResponseURLAllowed(raw string, hosts []string) bool {
	u, err := url.Parse(raw)
	if hosts == nil {
		hosts = approvals.ResponseURLHosts(nil)
	}
	return err == nil && approvals.DefaultSlackResponder.Allowed(u, hosts)
}
