package gateway

import (
	"net/http"
	"net/url"
)

// RespondToSlackAt has s post what came of Slack interactions with client
// to response URLs on host, a test server's, in place of hooks.slack.com.
func RespondToSlackAt(s *Server, client *http.Client, host string) {
	s.slackOut.Store(&slackResponder{client: client, allowed: func(u *url.URL) bool { return u.Host == host }})
}

// SlackResponseURLAllowed reports whether a gateway posts a Slack reply to
// the response URL raw.
func SlackResponseURLAllowed(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && defaultSlackResponder.allowed(u)
}
