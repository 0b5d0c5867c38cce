package console

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/jsonx"
)

// The console's pages and actions for what waits on people and what they
// start: the questions approval steps ask, a split's failed items run
// again, a trigger or schedule paused, a run started by hand. Each goes
// through Ops, as the API's do.

// ---- Labels ----

// labelLink is one of a run's labels, with the runs list of the runs that
// carry it.
type labelLink struct {
	Key, Value string
	Link       string
}

// labelLinks are a run's labels by key, each linked to the runs with it.
func (c *console) labelLinks(labels map[string]string) []labelLink {
	out := make([]labelLink, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		out = append(out, labelLink{Key: k, Value: labels[k], Link: c.base + "/runs?" + url.Values{"label": {k + "=" + labels[k]}}.Encode()})
	}
	return out
}

// filledIn drops the fields left empty from a form's values.
func filledIn(vals []string) []string {
	out := []string{}
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// ---- Approvals ----

// approvalLine is one question an approval step asks now.
type approvalLine struct {
	Run    *api.Run
	Labels []labelLink
	// Step is the step's key: a sub-step of a group is GROUP/NAME.
	Step     string
	Message  string
	Asked    time.Time
	Deadline time.Time
	// Late is a question past its deadline: its timeout is to be applied,
	// and no answer is taken.
	Late bool
}

type approvalsView struct {
	At    time.Time
	Lines []*approvalLine
	// More says there are more runs waiting than the page read.
	More     bool
	CanWrite bool
	CSRF     string
	Base     string
}

// maxApprovalRuns bounds the waiting runs the approvals page reads.
const maxApprovalRuns = api.MaxPageLimit

func (c *console) approvalsPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	ctx := r.Context()
	page, err := c.ops.ListRuns(ctx, store.RunFilter{Status: store.RunWaiting, Limit: maxApprovalRuns, NoOrigins: true})
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	v := &approvalsView{At: time.Now(), More: page.Next != "", CanWrite: c.canWrite(sess), CSRF: sess.csrf, Base: c.base}
	for _, run := range page.Runs {
		lines, err := c.questions(ctx, run)
		if err != nil {
			// Gone since it was listed, or unreadable: the rest still show.
			c.log.Warn("reading a waiting run's approval steps for the console", "run", run.ID, "err", err)
			continue
		}
		v.Lines = append(v.Lines, lines...)
	}
	// The nearest deadline first; questions without one after, oldest
	// first.
	slices.SortStableFunc(v.Lines, func(a, b *approvalLine) int {
		switch {
		case a.Deadline.IsZero() != b.Deadline.IsZero():
			if a.Deadline.IsZero() {
				return 1
			}
			return -1
		case !a.Deadline.Equal(b.Deadline):
			return a.Deadline.Compare(b.Deadline)
		}
		return a.Asked.Compare(b.Asked)
	})
	c.livePage(w, r, sess, "approvals-live", "approvals.html", "Approvals", "approvals", v)
}

// questions are the approval steps of a run that wait for an answer.
func (c *console) questions(ctx context.Context, run *api.Run) ([]*approvalLine, error) {
	rv, err := c.ops.Run(ctx, run.ID, false)
	if err != nil {
		return nil, err
	}
	def, err := c.host.Definition(ctx, rv.Chain, rv.ChainHash)
	if err != nil {
		return nil, err
	}
	var out []*approvalLine
	for _, key := range slices.Sorted(maps.Keys(rv.Steps)) {
		rec := rv.Steps[key]
		s := def.Step(rec.Name)
		if s == nil || s.Kind != chain.KindApproval || rec.Status != string(store.StepRunning) || rec.StartedAt.IsZero() {
			continue
		}
		var body struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(rec.Body, &body)
		out = append(out, &approvalLine{Run: run, Labels: c.labelLinks(run.Labels), Step: key, Message: body.Message,
			Asked: rec.StartedAt, Deadline: rec.Deadline, Late: !rec.Deadline.IsZero() && !time.Now().Before(rec.Deadline)})
	}
	return out, nil
}

// answered waits, briefly, for an answered step to take its answer, so
// that the approvals page drawn next no longer asks it. The runner that
// holds the run takes it at once; one on another gateway within two
// seconds.
func (c *console) answered(ctx context.Context, id, step string) {
	ctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer cancel()
	for {
		rec, err := c.ops.Step(ctx, id, step)
		if err != nil || rec.Status != string(store.StepRunning) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ---- Redrive ----

// redriveLine is a top-level split of a run that ended with items to run
// again.
type redriveLine struct {
	Step             string
	Failed, Skipped  int
	FailedAndSkipped int
}

// redrives are the splits of a run that ended whose failed or skipped
// items can run again: top-level splits that ended, of a run that is no
// sub-chain's.
func redrives(run *api.Run, nodes []*api.DAGNode) []redriveLine {
	if !run.Final() || run.ParentRun != "" {
		return nil
	}
	var out []redriveLine
	for _, n := range nodes {
		if n.Split == nil || !store.StepStatus(n.Status).Final() || n.Split.Failed+n.Split.Skipped == 0 {
			continue
		}
		out = append(out, redriveLine{Step: n.Name, Failed: n.Split.Failed, Skipped: n.Split.Skipped, FailedAndSkipped: n.Split.Failed + n.Split.Skipped})
	}
	return out
}

// redrive runs again a split's failed items, or its failed and skipped
// ones, and shows the run going on.
func (c *console) redrive(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	id, step := r.PathValue("id"), r.PathValue("step")
	var opts engine.RedriveOptions
	switch items := r.PostFormValue("items"); items {
	case api.RedriveFailed:
	case api.RedriveFailedAndSkipped:
		opts.Skipped = true
	default:
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("items must be %s or %s", api.RedriveFailed, api.RedriveFailedAndSkipped))
		return
	}
	run, err := c.ops.RedriveSplit(r.Context(), id, step, opts)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	code := "redriven-failed"
	if opts.Skipped {
		code = "redriven-skipped"
	}
	http.Redirect(w, r, flashed(c.base+"/runs/"+url.PathEscape(cmp.Or(run.ID, id)), code), http.StatusSeeOther)
}

// ---- Pause ----

// pausable is a trigger or schedule, and its pause if it is paused.
type pausable struct {
	Kind, Name, Chain string
	// What it is: a trigger's type, a schedule's cron or interval.
	What  string
	Pause *api.Pause
}

// pausables are the config's triggers and schedules, with their pauses.
func (c *console) pausables(ctx context.Context) ([]*pausable, error) {
	ps, err := c.ops.Pauses(ctx)
	if err != nil {
		return nil, err
	}
	paused := map[string]*api.Pause{}
	for _, p := range ps {
		paused[p.Kind+"\x00"+p.Name] = p
	}
	cfg := c.host.Config()
	var out []*pausable
	for _, name := range cfg.TriggerNames {
		tr := cfg.Triggers[name]
		out = append(out, &pausable{Kind: api.PauseTrigger, Name: name, Chain: tr.Chain, What: string(tr.Type), Pause: paused[api.PauseTrigger+"\x00"+name]})
	}
	for _, name := range cfg.ScheduleNames {
		s := cfg.Schedules[name]
		what := "cron " + s.Cron
		if s.Every > 0 {
			what = "every " + s.Every.String()
		}
		out = append(out, &pausable{Kind: api.PauseSchedule, Name: name, Chain: s.Chain, What: what, Pause: paused[api.PauseSchedule+"\x00"+name]})
	}
	return out, nil
}

// pauseBack are the pages a pause or unpause returns to.
var pauseBack = map[string]string{"": "/chains", "chains": "/chains", "now": "/"}

// pauseAction pauses or unpauses a trigger or schedule, and goes back to
// the page it was asked from.
func (c *console) pauseAction(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	kind, name := r.PathValue("kind"), r.PathValue("name")
	back, ok := pauseBack[r.PostFormValue("back")]
	if !ok {
		back = pauseBack[""]
	}
	var code string
	switch r.PostFormValue("action") {
	case "pause":
		reason := strings.TrimSpace(r.PostFormValue("reason"))
		if len(reason) > api.MaxComment {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("the reason is %d bytes; at most %d", len(reason), api.MaxComment))
			return
		}
		if _, err := c.ops.Pause(r.Context(), kind, name, reason); err != nil {
			c.failErr(w, r, err)
			return
		}
		code = "paused"
	case "unpause":
		p, err := c.ops.Resume(r.Context(), kind, name)
		if err != nil {
			c.failErr(w, r, err)
			return
		}
		code = "unpaused"
		if p == nil {
			code = "not-paused"
		}
	default:
		c.fail(w, r, http.StatusBadRequest, "action must be pause or unpause")
		return
	}
	http.Redirect(w, r, flashed(c.base+back, code), http.StatusSeeOther)
}

// ---- Run a chain ----

// inputField is one field of a chain's declared input, as the run form
// asks for it.
type inputField struct {
	Name     string
	Required bool
	// Text keeps what is typed a string: the input's schema says the
	// field is one.
	Text  bool
	Value string
}

// runForm is the form that starts a run of a chain: a field for each
// field the chain declares, or the whole payload as JSON.
type runForm struct {
	Fields []inputField
	// Whole asks for the payload as one JSON value: the chain declares no
	// fields (or a schema whose fields the form cannot list).
	Whole   bool
	Payload string
	Labels  string
	// Nonce is the form's own, once: it is the start's idempotency key,
	// so the form sent twice (a double click, a resend) starts one run.
	Nonce string
	// Error, with its Details, says why the last start was refused.
	Error   string
	Details []string
}

// newRunForm is the run form of a chain, empty.
func newRunForm(ch *chain.Chain) *runForm {
	f := &runForm{Payload: "{}", Nonce: randomToken()}
	f.Fields = inputFields(ch.Input)
	f.Whole = len(f.Fields) == 0
	return f
}

// inputFields are the fields a chain's input declares, required ones
// first: its required and optional lists, or the properties its schema
// gives at the top level. None when the chain declares no input, or a
// schema that is no plain object of properties.
func inputFields(in *chain.Input) []inputField {
	if in == nil {
		return nil
	}
	var out []inputField
	if in.Schema == nil {
		for _, name := range in.Required {
			out = append(out, inputField{Name: name, Required: true})
		}
		for _, name := range in.Optional {
			if !slices.Contains(in.Required, name) {
				out = append(out, inputField{Name: name})
			}
		}
		return out
	}
	doc, _ := in.SchemaDoc.(map[string]any)
	props, _ := doc["properties"].(map[string]any)
	if len(props) == 0 || (doc["type"] != nil && doc["type"] != "object") {
		return nil
	}
	for _, k := range []string{"$ref", "allOf", "anyOf", "oneOf", "if"} {
		if doc[k] != nil {
			return nil
		}
	}
	required, _ := doc["required"].([]any)
	var names []string
	for _, r := range required {
		if name, ok := r.(string); ok && props[name] != nil && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	nRequired := len(names)
	for _, name := range slices.Sorted(maps.Keys(props)) {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	for i, name := range names {
		p, _ := props[name].(map[string]any)
		out = append(out, inputField{Name: name, Required: i < nRequired, Text: p["type"] == "string"})
	}
	return out
}

// fieldValue is what a field typed in the run form holds: JSON as it is
// (42, true, ["a"], {"k": 1}, "quoted"), anything else a string, and
// always a string for a field the schema says is one.
func fieldValue(typed string, text bool) json.RawMessage {
	if v := strings.TrimSpace(typed); !text && json.Valid([]byte(v)) {
		return json.RawMessage(v)
	}
	b, _ := jsonx.Marshal(typed)
	return b
}

// payload is the run's payload the form makes: the whole JSON, or an
// object of the fields filled in (a field left empty is left out).
func (f *runForm) payload() json.RawMessage {
	if f.Whole {
		return json.RawMessage(f.Payload)
	}
	obj := map[string]json.RawMessage{}
	for _, fl := range f.Fields {
		if strings.TrimSpace(fl.Value) != "" {
			obj[fl.Name] = fieldValue(fl.Value, fl.Text)
		}
	}
	b, _ := jsonx.Marshal(obj)
	return b
}

// example is a payload of the form's fields, for the API call that starts
// the same run.
func (f *runForm) example() string {
	if f.Whole {
		return "{}"
	}
	parts := make([]string, len(f.Fields))
	for i, fl := range f.Fields {
		b, _ := jsonx.Marshal(fl.Name)
		parts[i] = string(b) + `: "..."`
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// labelLines are the labels the run form's box holds, one KEY=VALUE a
// line.
func labelLines(box string) []string {
	return filledIn(strings.Split(box, "\n"))
}

// startRun starts a run of a chain from its page's form and shows it; a
// start refused shows the form again, as filled in, saying why.
func (c *console) startRun(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	name := r.PathValue("name")
	cfg := c.host.Config()
	ch := cfg.Chains[name]
	if ch == nil {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no chain %q%s", name, cfg.ChainHint(name)))
		return
	}
	form := newRunForm(ch)
	form.Payload, form.Labels = r.PostFormValue("payload"), r.PostFormValue("labels")
	// A start refused and sent again, corrected, is still the same form's.
	if nonce := r.PostFormValue("nonce"); nonce != "" {
		form.Nonce = nonce
	}
	for i := range form.Fields {
		form.Fields[i].Value = r.PostFormValue("field." + form.Fields[i].Name)
	}
	refuse := func(err error) {
		ae := api.AsAPIError(err)
		form.Error, form.Details = ae.Message, ae.Details
		c.chainPageWith(w, r, sess, name, form, ae.Status)
	}
	if c.host.Stopping().Err() != nil {
		// As the API's start: the gateway is shutting down.
		refuse(engine.ErrClosed)
		return
	}
	if !isToken(form.Nonce) {
		form.Nonce = randomToken()
		refuse(&api.APIError{Status: http.StatusBadRequest, Code: "invalid_parameter", Message: "the form's nonce is not one the console gave; send the form again"})
		return
	}
	labels, err := api.ParseLabels("labels", labelLines(form.Labels), true)
	if err != nil {
		refuse(err)
		return
	}
	payload := form.payload()
	limit := cfg.Gateway.Limits.MaxRequestBytes
	if limit <= 0 {
		limit = chain.DefaultMaxRequestBytes
	}
	if len(payload) > limit {
		refuse(&http.MaxBytesError{Limit: int64(limit)})
		return
	}
	run, err := c.ops.StartRun(r.Context(), name, payload, api.StartOptions{Labels: labels, IdempotencyKey: "console/" + form.Nonce})
	if err != nil {
		refuse(err)
		return
	}
	http.Redirect(w, r, flashed(c.base+"/runs/"+url.PathEscape(run.ID), "started"), http.StatusSeeOther)
}
