package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/plugins/proto/providerv1"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/configschema"
)

// The checks that every plugin gets, in checklist order; the per-action
// checks (call/, bad-payload/, cancel/, deadline/) come between config and
// probe.
const (
	checkHandshake   = "handshake"
	checkDescribe    = "describe"
	checkConfig      = "config"
	checkProbe       = "probe"
	checkDedupKey    = "dedup-key"
	checkCtxCancel   = "ctx-cancel"
	checkCtxDeadline = "ctx-deadline"
	checkLargeBody   = "large-body"
	checkOrphan      = "orphan"
)

// badPayload is a payload no ordinary action accepts: a bare JSON string.
const badPayload = `"chaingate conformance check: this is not a valid payload"`

// largeBody is above gRPC's default 4 MiB message limit, which a plugin
// that does not take the gateway's limit would enforce, and well below the
// gateway's own.
const largeBody = 6 << 20

// deadlineIn is how far off the deadline checks put their deadline.
const deadlineIn = 300 * time.Millisecond

// checker runs one Check.
type checker struct {
	t      Target
	opts   Options
	report *Report
	runID  string

	s *session // the running plugin; nil once it could not be restarted
	// down says why there is no plugin to call, once there is none.
	down string
	info *providerv1.DescribeResponse
}

func newRunID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "conformance-" + hex.EncodeToString(b)
}

func (c *checker) pass(check, format string, args ...any) {
	c.report.add(check, Pass, fmt.Sprintf(format, args...))
}

func (c *checker) fail(check, format string, args ...any) {
	c.report.add(check, Fail, fmt.Sprintf(format, args...))
}

func (c *checker) skip(check, format string, args ...any) {
	c.report.add(check, Skip, fmt.Sprintf(format, args...))
}

func (c *checker) run(ctx context.Context) {
	defer func() {
		if c.s != nil {
			c.s.close()
		}
	}()
	rest := []string{checkDescribe, checkConfig, checkProbe, checkDedupKey, checkCtxCancel, checkCtxDeadline, checkLargeBody, checkOrphan}
	start := time.Now()
	s, err := c.launch(ctx)
	if err != nil {
		c.fail(checkHandshake, "starting the plugin: %v", err)
		for _, name := range rest {
			c.skip(name, "the plugin did not start")
		}
		return
	}
	c.s = s
	c.pass(checkHandshake, "started and completed the go-plugin handshake (protocol version %d) in %s", plugins.ProtocolVersion, ms(time.Since(start)))
	if !c.describe(ctx) {
		for _, name := range rest[1:] {
			c.skip(name, "Describe failed")
		}
		return
	}
	c.config()
	actions := c.actions()
	for _, a := range slices.Sorted(maps.Keys(c.opts.Payloads)) {
		if !c.declares(a) {
			c.fail("call/"+a, "a payload was given for %q, which Describe does not declare; validate refuses a step that uses it", a)
		}
	}
	var steps []func(context.Context)
	for _, check := range []func(context.Context, string){c.call, c.badPayload, c.cancel, c.deadline} {
		for _, a := range actions {
			steps = append(steps, func(ctx context.Context) { check(ctx, a) })
		}
	}
	steps = append(steps, func(ctx context.Context) {
		if c.probe(ctx) {
			c.dedupKey(ctx)
			c.ctxCancel(ctx)
			c.ctxDeadline(ctx)
			c.largeBody(ctx)
		}
	}, c.orphan)
	for _, step := range steps {
		if ctx.Err() != nil {
			c.report.Interrupted = true
			return
		}
		step(ctx)
	}
}

// launch starts the plugin as the gateway does and opens a session on it
// when it serves one.
func (c *checker) launch(ctx context.Context) (*session, error) {
	spec := host.Spec{Name: c.t.name(), Builtin: c.t.Builtin, Path: c.t.Path, Args: c.t.Args}
	conn, err := host.Dial(spec, host.Options{Executable: c.t.Executable, Logger: c.opts.Logger, StartTimeout: c.opts.Timeout})
	if err != nil {
		return nil, err
	}
	s := &session{conn: conn}
	dctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	desc, err := conn.RPC.Describe(dctx, &providerv1.DescribeRequest{})
	if err == nil && desc.Session {
		s.st, err = openStream(conn.RPC)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return s, nil
}

// plugin returns the running plugin, starting it again if it has exited,
// or nil, with c.down saying why, when it cannot be started.
func (c *checker) plugin(ctx context.Context) *session {
	if c.s != nil && !c.s.exited() {
		return c.s
	}
	if c.s != nil {
		c.s.close()
		c.s = nil
		s, err := c.launch(ctx)
		if err != nil {
			c.down = fmt.Sprintf("the plugin exited and could not be started again: %v", err)
			return nil
		}
		c.s = s
	}
	return c.s
}

// request builds a call the way the engine does.
func (c *checker) request(action string, payload json.RawMessage, deadline time.Time) *providerv1.ExecuteRequest {
	return &providerv1.ExecuteRequest{
		ActionType: action,
		Payload:    payload,
		Config:     c.opts.Config,
		DedupKey:   c.runID + "/" + action,
		Attempt:    1,
		RunId:      c.runID,
		Step:       "check-" + action,
		Deadline:   deadline.UnixNano(),
	}
}

func (c *checker) describe(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	desc, err := c.s.conn.RPC.Describe(ctx, &providerv1.DescribeRequest{})
	switch {
	case err != nil:
		c.fail(checkDescribe, "Describe failed: %v", err)
		return false
	case desc.Error != nil:
		c.fail(checkDescribe, "Describe answered an error: %s", wireError(desc.Error))
		return false
	}
	c.info = desc
	// An empty list, not null, says "any action type" in JSON.
	c.report.Plugin = &Plugin{Name: desc.Name, Version: desc.Version, ActionTypes: append([]string{}, desc.ActionTypes...), Session: desc.Session}
	var problems []string
	if desc.Name == "" {
		problems = append(problems, "it gives no name")
	}
	seen := map[string]bool{}
	for _, a := range desc.ActionTypes {
		switch {
		case strings.TrimSpace(a) == "":
			problems = append(problems, "it declares an empty action type")
		case strings.HasPrefix(a, providers.ReservedActionPrefix):
			problems = append(problems, fmt.Sprintf("action type %q is in the %q namespace, which the gateway reserves", a, providers.ReservedActionPrefix))
		case seen[a]:
			problems = append(problems, fmt.Sprintf("it declares action type %q twice", a))
		}
		seen[a] = true
	}
	if len(problems) > 0 {
		c.fail(checkDescribe, "Describe is wrong: %s", strings.Join(problems, "; "))
		return true
	}
	actions := "accepts any action type"
	if len(desc.ActionTypes) > 0 {
		actions = "actions " + strings.Join(desc.ActionTypes, ", ")
	}
	transport := "one gRPC call per call (no session)"
	if desc.Session {
		transport = "calls over a session"
	}
	c.pass(checkDescribe, "%s %s: %s; %s", desc.Name, desc.Version, actions, transport)
	return true
}

func (c *checker) config() {
	if len(c.info.ConfigSchema) == 0 {
		c.skip(checkConfig, "the provider declares no config schema, so the gateway cannot check its [providers.config] before a call")
		return
	}
	schema, err := configschema.Compile(c.info.ConfigSchema)
	if err != nil {
		c.fail(checkConfig, "the provider's config schema is broken: %v", err)
		return
	}
	problems := schema.Validate(c.opts.Config)
	if len(problems) == 0 {
		what := "the given config"
		if len(bytes.TrimSpace(c.opts.Config)) == 0 {
			what = "an empty config"
		}
		c.pass(checkConfig, "the config schema compiles and %s matches it", what)
		return
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = "config"
		if p.Path != "" {
			msgs[i] += "." + p.Path
		}
		msgs[i] += ": " + p.Message
	}
	c.fail(checkConfig, "the config does not match the provider's schema: %s", strings.Join(msgs, "; "))
}

// actions lists the action types to exercise: those declared or, for a
// provider that accepts any action type, those given a payload; failing
// that, "conformance", for the bad payload alone.
func (c *checker) actions() []string {
	if len(c.info.ActionTypes) > 0 {
		return c.info.ActionTypes
	}
	if given := slices.Sorted(maps.Keys(c.opts.Payloads)); len(given) > 0 {
		return given
	}
	c.skip("call", "the provider accepts any action type and no payload was given; pass --payload ACTION=JSON")
	return []string{"conformance"}
}

func (c *checker) payload(action string) json.RawMessage {
	return c.opts.Payloads[action]
}

func (c *checker) declares(action string) bool {
	return len(c.info.ActionTypes) == 0 || slices.Contains(c.info.ActionTypes, action)
}

// call sends an action its author's payload: it must succeed with JSON.
func (c *checker) call(ctx context.Context, action string) {
	name := "call/" + action
	payload := c.payload(action)
	switch {
	case action == "conformance" && payload == nil:
		return
	case payload == nil:
		c.skip(name, "no payload given for %q; pass --payload %s=JSON, or list it in --payloads", action, action)
		return
	}
	s := c.plugin(ctx)
	if s == nil {
		c.skip(name, "%s", c.down)
		return
	}
	start := time.Now()
	o := s.exec(ctx, c.request(action, payload, start.Add(c.opts.Timeout)), c.opts.Timeout+c.opts.Grace)
	switch {
	case o.resp == nil:
		c.fail(name, "%s", c.noAnswer(o, c.opts.Timeout))
	case o.resp.Error != nil:
		c.fail(name, "answered %s; the check expects the given payload to succeed", wireError(o.resp.Error))
	case len(o.resp.Body) > 0 && !json.Valid(o.resp.Body):
		c.fail(name, "answered a body that is not JSON: %s", snippet(o.resp.Body))
	default:
		c.pass(name, "answered in %s: %s", ms(o.at.Sub(start)), snippet(o.resp.Body))
	}
}

// badPayload sends a payload no ordinary action accepts: the answer must
// be a permanent error, since retrying cannot fix it, and never a crash.
func (c *checker) badPayload(ctx context.Context, action string) {
	name := "bad-payload/" + action
	s := c.plugin(ctx)
	if s == nil {
		c.skip(name, "%s", c.down)
		return
	}
	o := s.exec(ctx, c.request(action, json.RawMessage(badPayload), time.Now().Add(c.opts.Timeout)), c.opts.Timeout+c.opts.Grace)
	switch {
	case o.resp == nil:
		c.fail(name, "sent a JSON string as the payload: %s", c.noAnswer(o, c.opts.Timeout))
	case o.resp.Error == nil && c.opts.AcceptsAnyPayload:
		c.pass(name, "accepted a JSON string as the payload, as --accepts-any-payload allows")
	case o.resp.Error == nil:
		c.fail(name, "accepted a JSON string as the payload (answered %s); decode payloads strictly and answer providers.Permanent when one cannot be carried out, or pass --accepts-any-payload if the action really takes any JSON", snippet(o.resp.Body))
	case o.resp.Error.Code == "provider_panic":
		c.fail(name, "the provider panicked on a JSON string as the payload (%s); check the payload before using it and answer providers.Permanent", o.resp.Error.Message)
	case o.resp.Error.Retryable:
		c.fail(name, "answered a JSON string as the payload with %s; a bad payload stays bad however often it is retried, so answer providers.Permanent", wireError(o.resp.Error))
	default:
		c.pass(name, "answered %s", wireError(o.resp.Error))
	}
}

// cancel cancels a call to an action as soon as it is sent: the action
// must return promptly, which it does only if it honours ctx. Like deadline,
// it needs the action's payload, and is left out of the checklist without.
func (c *checker) cancel(ctx context.Context, action string) {
	name := "cancel/" + action
	if c.payload(action) == nil {
		return
	}
	s := c.plugin(ctx)
	switch {
	case s == nil:
		c.skip(name, "%s", c.down)
		return
	case s.st == nil:
		c.skip(name, "the plugin does not serve Session, the only way to see when a cancelled call returns; the gateway still cancels its calls' gRPC contexts")
		return
	}
	id, ch := s.st.start(c.request(action, c.payload(action), time.Now().Add(c.opts.Timeout)))
	cancelled := time.Now()
	if err := s.st.cancel(id); err != nil {
		c.fail(name, "sending the cancellation: %v", err)
		return
	}
	o := c.await(ctx, s, ch, c.opts.Grace)
	if o.resp == nil {
		c.fail(name, "%s; Execute must return when ctx is done: pass ctx to every call that does I/O and select on ctx.Done() while waiting", c.noAnswer(o, c.opts.Grace)+" after the call was cancelled")
		return
	}
	// An answer may overtake the cancellation it raced with.
	c.pass(name, "answered %s after the call was cancelled", ms(max(o.at.Sub(cancelled), 0)))
}

// deadline gives a call to an action a deadline a moment away: the action
// must answer by then, give or take the grace period.
func (c *checker) deadline(ctx context.Context, action string) {
	name := "deadline/" + action
	if c.payload(action) == nil {
		return
	}
	s := c.plugin(ctx)
	if s == nil {
		c.skip(name, "%s", c.down)
		return
	}
	deadline := time.Now().Add(deadlineIn)
	in := c.request(action, c.payload(action), deadline)
	var o outcome
	if s.st != nil {
		_, ch := s.st.start(in)
		o = c.await(ctx, s, ch, deadlineIn+c.opts.Grace)
	} else {
		o = s.exec(ctx, in, deadlineIn+c.opts.Grace)
	}
	switch {
	case o.resp == nil:
		c.fail(name, "%s; Execute must return by ctx's deadline: pass ctx to every call that does I/O", c.noAnswer(o, deadlineIn+c.opts.Grace)+" with a deadline "+ms(deadlineIn)+" away")
	default:
		c.pass(name, "answered after %s, with its deadline %s away", ms(o.at.Sub(deadline.Add(-deadlineIn))), ms(deadlineIn))
	}
}

// await waits at most wait for an answer on a session.
func (c *checker) await(ctx context.Context, s *session, ch <-chan answer, wait time.Duration) outcome {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	select {
	case a := <-ch:
		return s.settle(ctx, outcome{resp: a.resp, err: a.err, at: a.at})
	case <-ctx.Done():
		return s.settle(ctx, outcome{err: errNoAnswer, at: time.Now()})
	}
}

// noAnswer says why a call got no answer.
func (c *checker) noAnswer(o outcome, waited time.Duration) string {
	switch {
	case o.crashed != "":
		return "the plugin process exited during the call (" + o.crashed + ")"
	case o.err == errNoAnswer:
		return "no answer within " + ms(waited)
	}
	return "the call failed: " + o.err.Error()
}

// probeCall calls the probe and decodes its reply.
func (c *checker) probeCall(ctx context.Context, s *session, in *providerv1.ExecuteRequest) (host.ProbeReply, error) {
	return c.probeReply(s.exec(ctx, in, c.opts.Timeout), c.opts.Timeout)
}

// probe finds out whether the plugin answers host.ProbeAction.
func (c *checker) probe(ctx context.Context) bool {
	following := []string{checkDedupKey, checkCtxCancel, checkCtxDeadline, checkLargeBody}
	s := c.plugin(ctx)
	if s == nil {
		c.skip(checkProbe, "%s", c.down)
		for _, name := range following {
			c.skip(name, "%s", c.down)
		}
		return false
	}
	o := s.exec(ctx, c.request(host.ProbeAction, json.RawMessage(`{}`), time.Now().Add(c.opts.Timeout)), c.opts.Timeout)
	var reply host.ProbeReply
	ok := o.resp != nil && o.resp.Error == nil && json.Unmarshal(o.resp.Body, &reply) == nil && reply.ActionType == host.ProbeAction
	switch {
	case ok:
		c.pass(checkProbe, "the plugin answers %s (it is served by plugins.Serve)", host.ProbeAction)
		return true
	case o.crashed != "":
		c.fail(checkProbe, "the plugin process exited when called with the unknown action type %s (%s); answer providers.Permanent for an action type the provider does not know", host.ProbeAction, o.crashed)
	default:
		c.skip(checkProbe, "the plugin does not answer %s, which plugins.Serve answers for Go plugins; the checks that need it are skipped", host.ProbeAction)
	}
	for _, name := range following {
		c.skip(name, "needs the probe, which this plugin does not answer")
	}
	return false
}

// dedupKey checks that the request's identifying fields reach the plugin.
func (c *checker) dedupKey(ctx context.Context) {
	s := c.plugin(ctx)
	if s == nil {
		c.skip(checkDedupKey, "%s", c.down)
		return
	}
	in := c.request(host.ProbeAction, json.RawMessage(`{}`), time.Now().Add(c.opts.Timeout))
	in.DedupKey = c.runID + "/steps/notify-all/slack-alert"
	in.Attempt = 3
	in.Step = "slack-alert"
	reply, err := c.probeCall(ctx, s, in)
	if err != nil {
		c.fail(checkDedupKey, "%v", err)
		return
	}
	var wrong []string
	for _, f := range []struct {
		field     string
		got, want any
	}{
		{"dedup key", reply.DedupKey, in.DedupKey},
		{"attempt", int64(reply.Attempt), in.Attempt},
		{"run id", reply.RunID, in.RunId},
		{"step", reply.Step, in.Step},
		{"action type", reply.ActionType, in.ActionType},
	} {
		if f.got != f.want {
			wrong = append(wrong, fmt.Sprintf("%s %v arrived as %v", f.field, f.want, f.got))
		}
	}
	if len(wrong) > 0 {
		c.fail(checkDedupKey, "%s", strings.Join(wrong, "; "))
		return
	}
	c.pass(checkDedupKey, "the dedup key, attempt, run id and step reach the plugin intact")
}

// ctxCancel checks that cancelling a call ends the ctx the plugin's
// provider would get, promptly.
func (c *checker) ctxCancel(ctx context.Context) {
	s := c.plugin(ctx)
	switch {
	case s == nil:
		c.skip(checkCtxCancel, "%s", c.down)
		return
	case s.st == nil:
		c.skip(checkCtxCancel, "the plugin does not serve Session, the only way to see when a cancelled call returns")
		return
	}
	id, ch := s.st.start(c.request(host.ProbeAction, json.RawMessage(`{"block": true}`), time.Now().Add(c.opts.Timeout)))
	// Long enough for the call to be under way in the plugin.
	time.Sleep(50 * time.Millisecond)
	cancelled := time.Now()
	if err := s.st.cancel(id); err != nil {
		c.fail(checkCtxCancel, "sending the cancellation: %v", err)
		return
	}
	o := c.await(ctx, s, ch, c.opts.Grace)
	reply, err := c.probeReply(o, c.opts.Grace)
	switch {
	case err != nil:
		c.fail(checkCtxCancel, "after the call was cancelled: %v", err)
	case reply.Ended != context.Canceled.Error():
		c.fail(checkCtxCancel, "the call's ctx ended with %q, want %q", reply.Ended, context.Canceled.Error())
	default:
		c.pass(checkCtxCancel, "the call's ctx ended %s after the gateway cancelled it", ms(o.at.Sub(cancelled)))
	}
}

// ctxDeadline checks that the deadline reaches the plugin with the call
// and ends its ctx then, with context.DeadlineExceeded.
func (c *checker) ctxDeadline(ctx context.Context) {
	s := c.plugin(ctx)
	if s == nil {
		c.skip(checkCtxDeadline, "%s", c.down)
		return
	}
	deadline := time.Now().Add(deadlineIn)
	in := c.request(host.ProbeAction, json.RawMessage(`{"block": true}`), deadline)
	var o outcome
	if s.st != nil {
		_, ch := s.st.start(in)
		o = c.await(ctx, s, ch, deadlineIn+c.opts.Grace)
	} else {
		o = s.exec(ctx, in, deadlineIn+c.opts.Grace)
	}
	reply, err := c.probeReply(o, deadlineIn+c.opts.Grace)
	// The plugin may round the deadline to what its clock can hold.
	const slop = 10 * time.Millisecond
	switch {
	case err != nil:
		c.fail(checkCtxDeadline, "with a deadline %s away: %v", ms(deadlineIn), err)
	case reply.Deadline != in.Deadline:
		c.fail(checkCtxDeadline, "the request's deadline %d arrived as %d", in.Deadline, reply.Deadline)
	case reply.CtxDeadline == 0 || time.Duration(abs(reply.CtxDeadline-in.Deadline)) > slop:
		c.fail(checkCtxDeadline, "the provider's ctx has deadline %d, not the request's %d", reply.CtxDeadline, in.Deadline)
	case reply.Ended != context.DeadlineExceeded.Error():
		c.fail(checkCtxDeadline, "the call's ctx ended with %q, want %q", reply.Ended, context.DeadlineExceeded.Error())
	case o.at.Before(deadline.Add(-slop)):
		c.fail(checkCtxDeadline, "the call's ctx ended %s before its deadline", ms(deadline.Sub(o.at)))
	default:
		c.pass(checkCtxDeadline, "the provider's ctx carries the request's deadline and ended %s after it with %q", ms(o.at.Sub(deadline)), reply.Ended)
	}
}

func (c *checker) probeReply(o outcome, waited time.Duration) (host.ProbeReply, error) {
	var reply host.ProbeReply
	switch {
	case o.resp == nil:
		return reply, fmt.Errorf("%s", c.noAnswer(o, waited))
	case o.resp.Error != nil:
		return reply, fmt.Errorf("the probe answered %s", wireError(o.resp.Error))
	}
	if err := json.Unmarshal(o.resp.Body, &reply); err != nil {
		return reply, fmt.Errorf("the probe's reply is not a probe reply: %s", snippet(o.resp.Body))
	}
	return reply, nil
}

// largeBody sends a large request and asks for a large answer.
func (c *checker) largeBody(ctx context.Context) {
	s := c.plugin(ctx)
	if s == nil {
		c.skip(checkLargeBody, "%s", c.down)
		return
	}
	pad := strings.Repeat("x", largeBody)
	payload := json.RawMessage(`{"pad":"` + pad + `"}`)
	sum := sha256.Sum256(payload)
	reply, err := c.probeCall(ctx, s, c.request(host.ProbeAction, payload, time.Now().Add(c.opts.Timeout)))
	switch {
	case err != nil:
		c.fail(checkLargeBody, "sending a %s request: %v", mib(len(payload)), err)
		return
	case reply.PayloadBytes != len(payload) || reply.PayloadSHA256 != hex.EncodeToString(sum[:]):
		c.fail(checkLargeBody, "a %s request arrived as %d bytes with sha256 %s", mib(len(payload)), reply.PayloadBytes, reply.PayloadSHA256)
		return
	}
	o := s.exec(ctx, c.request(host.ProbeAction, json.RawMessage(fmt.Sprintf(`{"body_bytes": %d}`, largeBody)), time.Now().Add(c.opts.Timeout)), c.opts.Timeout)
	switch {
	case o.resp == nil:
		c.fail(checkLargeBody, "asking for a %s answer: %s", mib(largeBody), c.noAnswer(o, c.opts.Timeout))
	case o.resp.Error != nil:
		c.fail(checkLargeBody, "asking for a %s answer: the probe answered %s", mib(largeBody), wireError(o.resp.Error))
	case len(o.resp.Body) != largeBody:
		c.fail(checkLargeBody, "asked for a %s answer, got %d bytes", mib(largeBody), len(o.resp.Body))
	default:
		c.pass(checkLargeBody, "a %s request and a %s answer arrive intact", mib(len(payload)), mib(largeBody))
	}
}

func wireError(e *providerv1.Error) string {
	class := "a permanent"
	if e.Retryable {
		class = "a retryable"
	}
	if e.Code == "" {
		return fmt.Sprintf("%s error: %s", class, e.Message)
	}
	return fmt.Sprintf("%s error %s: %s", class, e.Code, e.Message)
}

// snippet shortens a body for a checklist line.
func snippet(body []byte) string {
	if len(body) == 0 {
		return "null"
	}
	var buf bytes.Buffer
	if json.Compact(&buf, body) == nil {
		body = buf.Bytes()
	}
	const limit = 80
	if len(body) > limit {
		return string(body[:limit]) + "…"
	}
	return string(body)
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

func mib(n int) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
