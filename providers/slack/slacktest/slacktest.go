// Package slacktest is a fake Slack for tests and load benchmarks: the Web
// API methods chat.postMessage and chat.update, and an incoming webhook,
// checked and answered as Slack documents them, errors included.
//
// The Web API lives under BaseURL (use it as the provider's base_url) and
// wants "Authorization: Bearer " + Token; the webhook lives at WebhookURL.
// Requests are decoded strictly: a field Slack does not document for the
// method is refused with invalid_arguments, so a provider that sends one is
// caught. Every channel exists; a channel given by name (#ops) gets a
// stable ID. Failures are injected with FailNext and the Fault helpers.
//
// It is the gateway's own package, with no compatibility promise.
package slacktest

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/chaingate/gateway/providers/internal/fakeapi"
)

// Token is the bot token the fake accepts.
const Token = "xoxb-000000000000-0000000000000-slacktestslacktestslackte"

// WebhookPath is the path of the fake's incoming webhook.
const WebhookPath = "/services/T00000000/B00000000/slacktestwebhooksecret00"

// WebhookChannel is the channel the webhook posts to.
const WebhookChannel = "C0WEBHOOK00"

// maxTextChars is Slack's limit on a message's text.
const maxTextChars = 40000

// maxBlocks is Slack's limit on the blocks of one message.
const maxBlocks = 50

// Request is one request the fake received.
type Request = fakeapi.Request

// Fault is an answer given instead of the normal one; see FailNext.
type Fault = fakeapi.Fault

// Message is a message the fake holds.
type Message struct {
	Channel  string
	TS       string
	ThreadTS string
	Text     string
	Blocks   json.RawMessage
	Edited   bool
}

// Server is the fake Slack. The embedded *fakeapi.Server gives URL, Close,
// Requests, Count, Record, FailNext, SetLatency and Reset.
type Server struct {
	*fakeapi.Server

	start time.Time

	mu       sync.Mutex
	seq      int64
	messages []Message
	byKey    map[string]int // channel + "/" + ts → index in messages
}

// NewServer starts a fake Slack; Close it when done.
func NewServer() *Server {
	s := &Server{start: time.Now(), byKey: map[string]int{}}
	s.Server = fakeapi.New(s.handle)
	return s
}

// BaseURL is the Web API's base URL, for the provider's base_url.
func (s *Server) BaseURL() string { return s.URL + "/api" }

// WebhookURL is the incoming webhook's URL, for the provider's webhook_url.
func (s *Server) WebhookURL() string { return s.URL + WebhookPath }

// Messages returns a copy of the messages posted, in order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

// Reset forgets requests, queued faults and messages.
func (s *Server) Reset() {
	s.Server.Reset()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.messages, s.byKey = nil, map[string]int{}
}

// RateLimited is Slack's answer to a caller over its rate limit: HTTP 429
// with Retry-After in seconds and {"ok":false,"error":"ratelimited"}.
func RateLimited(retryAfterSeconds int) Fault {
	return Fault{
		Status: http.StatusTooManyRequests, RetryAfter: fmt.Sprint(retryAfterSeconds),
		ContentType: "application/json; charset=utf-8", Body: `{"ok":false,"error":"ratelimited"}`,
	}
}

// APIError is a Web API error as Slack answers it: HTTP 200 with
// {"ok":false,"error":code}, e.g. channel_not_found or internal_error.
func APIError(code string) Fault {
	return Fault{Status: http.StatusOK, ContentType: "application/json; charset=utf-8", Body: `{"ok":false,"error":"` + code + `"}`}
}

// WebhookError is an incoming webhook's error: status with the code as
// plain text, e.g. 404 no_service or 410 channel_is_archived.
func WebhookError(status int, code string) Fault {
	return Fault{Status: status, ContentType: "text/html", Body: code}
}

var channelIDPattern = regexp.MustCompile(`^[CGD][A-Z0-9]{8,}$`)

// ChannelID is the ID the fake answers with for a channel given by ID or
// by name, as Slack answers with the ID of #ops.
func ChannelID(channel string) string {
	if channelIDPattern.MatchString(channel) {
		return channel
	}
	h := fnv.New32a()
	h.Write([]byte(strings.TrimPrefix(channel, "#")))
	return fmt.Sprintf("C%010X", h.Sum32())
}

// apiRequest holds every field the fake accepts on chat.postMessage and
// chat.update; methodFields says which apply to which.
type apiRequest struct {
	Channel        string          `json:"channel"`
	TS             string          `json:"ts"`
	Text           string          `json:"text"`
	Blocks         json.RawMessage `json:"blocks"`
	Attachments    json.RawMessage `json:"attachments"`
	ThreadTS       string          `json:"thread_ts"`
	ReplyBroadcast *bool           `json:"reply_broadcast"`
	Mrkdwn         *bool           `json:"mrkdwn"`
	UnfurlLinks    *bool           `json:"unfurl_links"`
	UnfurlMedia    *bool           `json:"unfurl_media"`
	Username       string          `json:"username"`
	IconEmoji      string          `json:"icon_emoji"`
	IconURL        string          `json:"icon_url"`
}

var methodFields = map[string][]string{
	"chat.postMessage": {"channel", "text", "blocks", "attachments", "thread_ts", "reply_broadcast", "mrkdwn", "unfurl_links", "unfurl_media", "username", "icon_emoji", "icon_url"},
	"chat.update":      {"channel", "ts", "text", "blocks", "attachments"},
}

type webhookRequest struct {
	Text        string          `json:"text"`
	Blocks      json.RawMessage `json:"blocks"`
	Attachments json.RawMessage `json:"attachments"`
	ThreadTS    string          `json:"thread_ts"`
	Mrkdwn      *bool           `json:"mrkdwn"`
	UnfurlLinks *bool           `json:"unfurl_links"`
	UnfurlMedia *bool           `json:"unfurl_media"`
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request, body []byte) int {
	switch {
	case r.URL.Path == WebhookPath:
		return s.webhook(w, r, body)
	case strings.HasPrefix(r.URL.Path, "/services/"):
		return fakeapi.WriteFault(w, WebhookError(http.StatusNotFound, "no_service"))
	case r.URL.Path == "/api/chat.postMessage", r.URL.Path == "/api/chat.update":
		return s.api(w, r, body, strings.TrimPrefix(r.URL.Path, "/api/"))
	case strings.HasPrefix(r.URL.Path, "/api/"):
		return fakeapi.WriteJSON(w, http.StatusNotFound, map[string]any{"ok": false, "error": "unknown_method"})
	default:
		http.NotFound(w, r)
		return http.StatusNotFound
	}
}

func apiError(w http.ResponseWriter, code string, details ...string) int {
	ans := map[string]any{"ok": false, "error": code}
	if len(details) > 0 {
		ans["response_metadata"] = map[string]any{"messages": details}
	}
	return fakeapi.WriteJSON(w, http.StatusOK, ans)
}

func (s *Server) api(w http.ResponseWriter, r *http.Request, body []byte, method string) int {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return http.StatusMethodNotAllowed
	}
	switch auth := r.Header.Get("Authorization"); {
	case auth == "":
		return apiError(w, "not_authed")
	case auth != "Bearer "+Token:
		return apiError(w, "invalid_auth")
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return apiError(w, "invalid_form_data")
	}
	var warning string
	if params["charset"] == "" {
		warning = "missing_charset"
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return apiError(w, "invalid_json")
	}
	for f := range fields {
		if !slices.Contains(methodFields[method], f) {
			return apiError(w, "invalid_arguments", "[ERROR] unsupported field: "+f)
		}
	}
	var req apiRequest
	if err := fakeapi.DecodeStrict(body, &req); err != nil {
		return apiError(w, "invalid_arguments", "[ERROR] "+err.Error())
	}
	if code := checkContent(req.Text, req.Blocks, req.Attachments); code != "" {
		return apiError(w, code)
	}
	if req.Channel == "" {
		return apiError(w, "channel_not_found")
	}
	channel := ChannelID(req.Channel)

	s.mu.Lock()
	defer s.mu.Unlock()
	var m Message
	if method == "chat.postMessage" {
		m = s.addLocked(Message{Channel: channel, ThreadTS: req.ThreadTS, Text: req.Text, Blocks: req.Blocks})
	} else {
		if req.TS == "" {
			return apiError(w, "invalid_arguments", "[ERROR] missing required field: ts")
		}
		i, ok := s.byKey[channel+"/"+req.TS]
		if !ok {
			return apiError(w, "message_not_found")
		}
		s.messages[i].Text, s.messages[i].Blocks, s.messages[i].Edited = req.Text, req.Blocks, true
		m = s.messages[i]
	}
	msg := map[string]any{"type": "message", "user": "U0SLACKTEST", "bot_id": "B0SLACKTEST", "text": m.Text, "ts": m.TS}
	if m.ThreadTS != "" {
		msg["thread_ts"] = m.ThreadTS
	}
	if len(m.Blocks) > 0 {
		msg["blocks"] = m.Blocks
	}
	ans := map[string]any{"ok": true, "channel": channel, "ts": m.TS, "message": msg}
	if method == "chat.update" {
		ans["text"] = m.Text
	}
	if warning != "" {
		ans["warning"] = warning
		ans["response_metadata"] = map[string]any{"warnings": []string{warning}}
	}
	return fakeapi.WriteJSON(w, http.StatusOK, ans)
}

// checkContent returns the error Slack gives for a message's content, or "".
func checkContent(text string, blocks, attachments json.RawMessage) string {
	if text == "" && isNull(blocks) && isNull(attachments) {
		return "no_text"
	}
	if utf8.RuneCountInString(text) > maxTextChars {
		return "msg_too_long"
	}
	if !isNull(blocks) {
		var bs []map[string]json.RawMessage
		if json.Unmarshal(blocks, &bs) != nil || len(bs) > maxBlocks {
			return "invalid_blocks"
		}
		for _, b := range bs {
			if _, ok := b["type"]; !ok {
				return "invalid_blocks"
			}
		}
	}
	if !isNull(attachments) {
		var as []map[string]json.RawMessage
		if json.Unmarshal(attachments, &as) != nil {
			return "invalid_attachments"
		}
	}
	return ""
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

func (s *Server) webhook(w http.ResponseWriter, r *http.Request, body []byte) int {
	if r.Method != http.MethodPost {
		return fakeapi.WriteFault(w, WebhookError(http.StatusMethodNotAllowed, "invalid_request_method"))
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return fakeapi.WriteFault(w, WebhookError(http.StatusBadRequest, "invalid_payload"))
	}
	var req webhookRequest
	if err := fakeapi.DecodeStrict(body, &req); err != nil {
		return fakeapi.WriteFault(w, WebhookError(http.StatusBadRequest, "invalid_payload"))
	}
	if code := checkContent(req.Text, req.Blocks, req.Attachments); code != "" {
		if code == "no_text" {
			return fakeapi.WriteFault(w, WebhookError(http.StatusBadRequest, code))
		}
		return fakeapi.WriteFault(w, WebhookError(http.StatusBadRequest, "invalid_payload"))
	}
	s.mu.Lock()
	s.addLocked(Message{Channel: WebhookChannel, ThreadTS: req.ThreadTS, Text: req.Text, Blocks: req.Blocks})
	s.mu.Unlock()
	return fakeapi.WriteFault(w, Fault{Status: http.StatusOK, ContentType: "text/html", Body: "ok"})
}

// addLocked stores m under a new, unique ts, as Slack's are: seconds and
// microseconds. s.mu must be held.
func (s *Server) addLocked(m Message) Message {
	s.seq++
	micro := s.start.UnixMicro() + s.seq
	m.TS = fmt.Sprintf("%d.%06d", micro/1e6, micro%1e6)
	s.byKey[m.Channel+"/"+m.TS] = len(s.messages)
	s.messages = append(s.messages, m)
	return m
}
