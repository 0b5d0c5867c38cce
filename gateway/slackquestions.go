package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/slack"
)

// A Slack message asks an approval step's question when its blocks hold
// answer buttons (chaingate:approve, chaingate:reject) whose value names
// the run and the step. A slack provider's post_message or update_message
// that sends one, from a step or an approval's notify, is kept in the
// store under the question, once it succeeded and before the run goes on.
// Once the question no longer stands — answered on any path, on_timeout,
// on_resolve, the run cancelled or ended however — the approval loop
// settles each message through the provider that posted it: the answer
// buttons gone, and what became of the question said below them, as a
// click's answer does. The record goes once every message is settled, so
// a gateway that stops first finds it again when it starts; settling is
// an update that says the same whoever makes it, so two gateways may
// both make it.

// QuestionPrefix names the records of the messages that asked a question:
// QuestionPrefix + RUN/STEP holds them, as a JSON array.
const QuestionPrefix = "slack/question/"

// questionLockPrefix names the lock taken to change a question's record.
const questionLockPrefix = "slack/question-lock/"

// questionTTL keeps a question's messages as long as any wait.
const questionTTL = 400 * 24 * time.Hour

// questionLockTTL bounds how long a lock outlives a gateway that died
// holding it; a holder only reads and writes the record.
const questionLockTTL = 10 * time.Second

// questionRecordTime bounds recording a question's message, which the
// step that posted it waits for.
const questionRecordTime = 15 * time.Second

// ErrQuestionChanged is a question whose messages changed while they were
// being settled: settling it again takes in the new ones.
var ErrQuestionChanged = errors.New("messages were recorded while the question's were settled")

// QuestionMessage is a message that asked a question, as it was sent.
type QuestionMessage struct {
	Provider string            `json:"provider"`
	Channel  string            `json:"channel"`
	TS       string            `json:"ts"`
	Text     string            `json:"text,omitempty"`
	Blocks   []json.RawMessage `json:"blocks"`
}

// SlackQuestions keeps the messages that ask questions.
type SlackQuestions struct {
	store    store.Store
	redactor *secrets.Redactor
	log      *slog.Logger
	// look has the approval loop look at a run whose question was asked.
	look func(runID string)
}

// asks returns the questions (RUN/STEP) whose answer buttons a Slack call
// sends, if it is one that posts or updates a message.
func asks(req providers.Request) []string {
	if req.ActionType != slack.PostMessage && req.ActionType != slack.UpdateMessage {
		return nil
	}
	var m struct {
		Blocks []json.RawMessage `json:"blocks"`
	}
	if json.Unmarshal(req.Payload, &m) != nil {
		return nil
	}
	var out []string
	for _, b := range m.Blocks {
		var actions struct {
			Type     string        `json:"type"`
			Elements []SlackAction `json:"elements"`
		}
		if json.Unmarshal(b, &actions) != nil || actions.Type != "actions" {
			continue
		}
		for _, e := range actions.Elements {
			d, answers := strings.CutPrefix(e.ActionID, SlackActionPrefix)
			if answers && (d == chain.DecisionApprove || d == chain.DecisionReject) && validQuestion(e.Value) && !slices.Contains(out, e.Value) {
				out = append(out, e.Value)
			}
		}
	}
	return out
}

// validQuestion reports whether v names a run and one of its steps.
func validQuestion(v string) bool {
	i := strings.LastIndexByte(v, '/')
	return i > 0 && i < len(v)-1
}

// record keeps the message a successful call posted or updated as one
// that asks each of questions.
func (q *SlackQuestions) record(ctx context.Context, provider string, req providers.Request, resp providers.Response, questions []string) {
	var posted struct {
		Channel string `json:"channel"`
		TS      string `json:"ts"`
	}
	if json.Unmarshal(resp.Body, &posted) != nil || posted.Channel == "" || posted.TS == "" {
		return
	}
	var content struct {
		Text   string            `json:"text"`
		Blocks []json.RawMessage `json:"blocks"`
	}
	// As the store keeps payloads: with no secret in them.
	_ = json.Unmarshal(q.redactor.JSON(req.Payload), &content)
	m := QuestionMessage{Provider: provider, Channel: posted.Channel, TS: posted.TS, Text: content.Text, Blocks: content.Blocks}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), questionRecordTime)
	defer cancel()
	for _, id := range questions {
		err := q.Locked(ctx, id, func() error {
			list, bound, err := q.Read(ctx, id)
			if err != nil {
				return err
			}
			kept := list[:0:0]
			for _, e := range list {
				if e.Channel != m.Channel || e.TS != m.TS {
					kept = append(kept, e)
				}
			}
			return q.Write(ctx, id, bound, append(kept, m))
		})
		if err != nil {
			q.log.Warn("recording a Slack message that asks an approval step's question; its buttons stay once it is answered", "question", id, "channel", m.Channel, "ts", m.TS, "err", err)
			continue
		}
		runID, _ := SplitQuestion(id)
		q.look(runID)
	}
}

// Read returns the messages kept for question id, and the record as it
// is bound.
func (q *SlackQuestions) Read(ctx context.Context, id string) ([]QuestionMessage, string, error) {
	bound, err := q.store.KeyRun(ctx, QuestionPrefix+id)
	if err != nil || bound == "" {
		return nil, "", err
	}
	var list []QuestionMessage
	if err := json.Unmarshal([]byte(bound), &list); err != nil {
		return nil, "", fmt.Errorf("reading the Slack messages of question %s: %w", id, err)
	}
	return list, bound, nil
}

// Write replaces question id's record, bound as old, with list; the caller
// holds its lock.
func (q *SlackQuestions) Write(ctx context.Context, id, old string, list []QuestionMessage) error {
	key := QuestionPrefix + id
	if old != "" {
		if err := q.store.ReleaseKey(ctx, key, old); err != nil {
			return err
		}
	}
	if len(list) == 0 {
		return nil
	}
	b, err := jsonx.Marshal(list)
	if err != nil {
		return err
	}
	bound, err := q.store.ClaimKey(ctx, key, string(b), questionTTL)
	if err == nil && bound != "" {
		err = fmt.Errorf("writing the Slack messages of question %s: written meanwhile without the lock", id)
	}
	return err
}

// Locked runs fn holding question id's lock, which gateways sharing the
// store take to change its record.
func (q *SlackQuestions) Locked(ctx context.Context, id string, fn func() error) error {
	key, me := questionLockPrefix+id, store.NewID()
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		bound, err := q.store.ClaimKey(ctx, key, me, questionLockTTL)
		if err != nil {
			return fmt.Errorf("locking the Slack messages of question %s: %w", id, err)
		}
		if bound == "" {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("locking the Slack messages of question %s: %w", id, ctx.Err())
		case <-time.After(wait):
		}
	}
	defer func() {
		if err := q.store.ReleaseKey(context.WithoutCancel(ctx), key, me); err != nil {
			q.log.Warn("unlocking the Slack messages of a question; the lock lapses", "question", id, "err", err)
		}
	}()
	return fn()
}

// Forget drops the messages settled from question id's record, and says
// whether messages came that were not among those read.
func (q *SlackQuestions) Forget(ctx context.Context, id string, read, settled []QuestionMessage) (bool, error) {
	changed := false
	err := q.Locked(ctx, id, func() error {
		list, bound, err := q.Read(ctx, id)
		if err != nil {
			return err
		}
		var kept []QuestionMessage
		for _, m := range list {
			if !holds(settled, m) {
				kept = append(kept, m)
				changed = changed || !holds(read, m)
			}
		}
		if len(kept) == len(list) {
			return nil
		}
		return q.Write(ctx, id, bound, kept)
	})
	return changed, err
}

// holds reports whether list holds m as it is.
func holds(list []QuestionMessage, m QuestionMessage) bool {
	want, _ := jsonx.Marshal(m)
	for _, e := range list {
		if got, _ := jsonx.Marshal(e); bytes.Equal(got, want) {
			return true
		}
	}
	return false
}

// SplitQuestion is the run and the step question id names.
func SplitQuestion(id string) (runID, step string) {
	i := strings.LastIndexByte(id, '/')
	return id[:i], id[i+1:]
}

// questionAsker is a Slack provider whose calls that ask a question have
// their message recorded.
type questionAsker struct {
	providers.Provider
	name string
	q    *SlackQuestions
}

// callStarter is a provider that makes a call without a goroutine waiting
// on it, as the engine's starter.
type callStarter interface {
	Start(ctx context.Context, req providers.Request, done func(providers.Response, error))
}

// Execute implements providers.Provider.
func (a *questionAsker) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	questions := asks(req)
	resp, err := a.Provider.Execute(ctx, req)
	if err == nil && len(questions) > 0 {
		a.q.record(ctx, a.name, req, resp, questions)
	}
	return resp, err
}

// Start makes the call as the provider it wraps does; a message that asks
// is recorded before done hears of it, so before the run goes on.
func (a *questionAsker) Start(ctx context.Context, req providers.Request, done func(providers.Response, error)) {
	if questions := asks(req); len(questions) > 0 {
		answered := done
		done = func(resp providers.Response, err error) {
			if err != nil {
				answered(resp, err)
				return
			}
			// done must not block: the record is written aside.
			go func() {
				a.q.record(ctx, a.name, req, resp, questions)
				answered(resp, err)
			}()
		}
	}
	if s, ok := a.Provider.(callStarter); ok {
		s.Start(ctx, req, done)
		return
	}
	go func() { done(a.Provider.Execute(ctx, req)) }()
}

type SlackAction struct {
	ActionID string `json:"action_id"`
	Value    string `json:"value"`
}

// SlackActionPrefix starts the action_id of an answer button; the
// decision follows it.
const SlackActionPrefix = "chaingate:"
