package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/internal/textx"
	"github.com/chaingate/gateway/providers/limits"
)

func (c *console) funcs() template.FuncMap {
	return template.FuncMap{
		"ago": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return time.Since(t).Round(time.Second).String() + " ago"
		},
		"when": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05.000Z")
		},
		// took is how long something took. Something still running is a
		// span the page's script moves on each second from the figure
		// drawn here, whatever the browser's clock says.
		"took": func(from, to time.Time) template.HTML {
			if from.IsZero() {
				return ""
			}
			if to.IsZero() {
				d := time.Since(from)
				return template.HTML(`<span class="took" data-ms="` + strconv.FormatInt(d.Milliseconds(), 10) + `">` + d.Round(time.Second).String() + `</span>`)
			}
			return template.HTML(to.Sub(from).Round(time.Millisecond).String())
		},
		// until is how long until t, to the second.
		"until": func(t time.Time) string { return time.Until(t).Round(time.Second).String() },
		"json":  func(b []byte) string { return prettyJSON(b) },
		"esc":   url.PathEscape,
		"q":     url.QueryEscape,
		"add":   func(a, b int) int { return a + b },
		"has":   func(list []string, s string) bool { return slices.Contains(list, s) },
		// labelLinks are a run's labels, each a link to the runs with it.
		"labelLinks": c.labelLinks,
		// A run's StartedBy apart: "trigger:am" is started by trigger am.
		"startedKind": store.StartedKind,
		"startedName": func(startedBy string) string {
			_, name, _ := strings.Cut(startedBy, ":")
			return name
		},
	}
}

// ---- Now ----

// nowView is the home page: what is broken now.
type nowView struct {
	// At is when the page was drawn: the page follows what happens, and
	// says how fresh it is.
	At        time.Time
	Since     string
	Failures  []*failureGroup
	DLQDepth  int
	DLQRecent int
	DLQBefore int
	InFlight  []*runLine
	// Waiting counts the runs waiting on a person (an approval step).
	Waiting int
	// Paused are the triggers and schedules paused now; a session that
	// may write unpauses them here.
	Paused    []*api.Pause
	CanWrite  bool
	CSRF      string
	Slow      int
	Providers []limits.Stats
	Calls     map[string][2]float64 // provider → ok, error
	Fanout    bool
	FanStats  map[string]float64
}

type failureGroup struct {
	Chain, Step, Error string
	Count              int
	Link               string
}

type runLine struct {
	*api.Run
	Slow bool
	Step string
}

// failureWindow is how far back the home page looks for failures.
const failureWindow = 15 * time.Minute

var (
	// quotedLike is a quoted value as %q writes it, escaped quotes and all.
	quotedLike = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	// wordLike is a run of letters and digits, hyphens joining them, for
	// isID to tell the ids among (a UUID is hyphenated, db-01m8… holds one).
	wordLike = regexp.MustCompile(`[0-9A-Za-z]+(?:-[0-9A-Za-z]+)*`)
	idLike   = regexp.MustCompile(`^(?:[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-hjkmnp-tv-z]{26}|[0-9a-fA-F]{8,})$`)
	// numberLike is every number, inside a word too (db-1, 5xx, a time's
	// 07Z), so that messages differing only in numbers read the same.
	numberLike = regexp.MustCompile(`\d+(?:\.\d+)?`)
)

// normaliseError groups messages that differ only in ids, numbers and
// quoted values.
func normaliseError(msg string) string {
	msg = quotedLike.ReplaceAllString(msg, `"…"`)
	msg = wordLike.ReplaceAllStringFunc(msg, func(w string) string {
		if isID(w) {
			return "…"
		}
		parts := strings.Split(w, "-")
		for i, p := range parts {
			if isID(p) {
				parts[i] = "…"
			}
		}
		return strings.Join(parts, "-")
	})
	return textx.Short(numberLike.ReplaceAllString(msg, "N"), 200)
}

// isID reports whether a word is an id (a UUID, a run's ULID, a digest or
// fingerprint in hex): one idLike matches that holds both digits and
// letters, which a number or a plain word does not.
func isID(w string) bool {
	return idLike.MatchString(w) && strings.ContainsAny(w, "0123456789") &&
		strings.IndexFunc(w, func(r rune) bool { return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' }) >= 0
}

func (c *console) nowPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	ctx := r.Context()
	ops := c.ops
	v := &nowView{At: time.Now(), Since: "15 minutes", Calls: map[string][2]float64{}, FanStats: map[string]float64{}, Fanout: c.host.Distributes(),
		CanWrite: c.canWrite(sess), CSRF: sess.csrf}
	since := time.Now().Add(-failureWindow)
	failed, err := ops.ListRuns(ctx, store.RunFilter{Status: store.RunFailed, Since: since, Limit: api.MaxPageLimit, NoOrigins: true})
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	groups := map[string]*failureGroup{}
	for _, run := range failed.Runs {
		step := run.Cursor
		if step == "" && len(run.Path) > 0 {
			step = run.Path[len(run.Path)-1]
		}
		if f := run.Failure; f != nil && f.Step != "" {
			// Its handlers ran after the step that failed.
			step = f.Step
		}
		msg := ""
		if run.Error != nil {
			msg = normaliseError(run.Error.Message)
		}
		k := run.Chain + "\x00" + step + "\x00" + msg
		g := groups[k]
		if g == nil {
			g = &failureGroup{Chain: run.Chain, Step: step, Error: msg,
				Link: c.base + "/runs?status=failed&since=" + url.QueryEscape(failureWindow.String()) + "&chain=" + url.QueryEscape(run.Chain)}
			groups[k] = g
			v.Failures = append(v.Failures, g)
		}
		g.Count++
	}
	sort.SliceStable(v.Failures, func(i, j int) bool { return v.Failures[i].Count > v.Failures[j].Count })

	entries, err := api.ListAllDLQ(ctx, ops, store.DLQFilter{Limit: maxConsoleDLQ})
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	v.DLQDepth = len(entries)
	for _, e := range entries {
		switch {
		case e.CreatedAt.After(since):
			v.DLQRecent++
		case e.CreatedAt.After(since.Add(-failureWindow)):
			v.DLQBefore++
		}
		if e.Kind == store.DLQDelivery && e.CreatedAt.After(since) {
			// A delivery no run was started for fails no run: it is a
			// failure of its own.
			msg := normaliseError(e.Error.Message)
			k := "delivery\x00" + e.Trigger + "\x00" + e.Chain + "\x00" + msg
			g := groups[k]
			if g == nil {
				g = &failureGroup{Chain: e.Chain, Step: "trigger " + e.Trigger + ": no run started", Error: msg,
					Link: c.base + "/dlq?chain=" + url.QueryEscape(e.Chain) + "&since=" + url.QueryEscape(failureWindow.String())}
				groups[k] = g
				v.Failures = append(v.Failures, g)
			}
			g.Count++
		}
	}
	sort.SliceStable(v.Failures, func(i, j int) bool { return v.Failures[i].Count > v.Failures[j].Count })

	running, err := ops.ListRuns(ctx, store.RunFilter{Status: store.RunRunning, Limit: 200, NoOrigins: true})
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	// Runs waiting on a person are as much in flight.
	waiting, err := ops.ListRuns(ctx, store.RunFilter{Status: store.RunWaiting, Limit: 200, NoOrigins: true})
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	v.Waiting = len(waiting.Runs)
	if v.Paused, err = ops.Pauses(ctx); err != nil {
		c.failErr(w, r, err)
		return
	}
	running.Runs = append(running.Runs, waiting.Runs...)
	usual := c.usualDurations(ctx, running.Runs)
	for _, run := range running.Runs {
		l := &runLine{Run: run, Step: run.Cursor}
		if d, ok := usual[run.Chain]; ok && time.Since(run.CreatedAt) > 2*d+time.Second {
			l.Slow = true
			v.Slow++
		}
		v.InFlight = append(v.InFlight, l)
	}
	v.Providers = c.host.ProviderStats()
	for _, smp := range c.host.MetricSamples("chaingate_provider_calls_total") {
		cur := v.Calls[smp.Labels["provider"]]
		if smp.Labels["result"] == "ok" {
			cur[0] = smp.Value
		} else {
			cur[1] += smp.Value
		}
		v.Calls[smp.Labels["provider"]] = cur
	}
	for _, name := range []string{"chaingate_fanout_items_in_flight", "chaingate_fanout_items_published_total", "chaingate_fanout_items_redelivered_total", "chaingate_fanout_items_poisoned_total", "chaingate_fanout_worker_items"} {
		for _, smp := range c.host.MetricSamples(name) {
			v.FanStats[strings.TrimPrefix(name, "chaingate_fanout_")] += smp.Value
		}
	}
	c.livePage(w, r, sess, "now-live", "now.html", "Now", "now", v)
}

// maxConsoleDLQ bounds the dead-letter entries one console page reads.
const maxConsoleDLQ = 10000

// usualDurations is, by chain, the median time its last successful runs
// took: a running run well past it is worth a look.
func (c *console) usualDurations(ctx context.Context, running []*api.Run) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, run := range running {
		if _, seen := out[run.Chain]; seen {
			continue
		}
		page, err := c.ops.ListRuns(ctx, store.RunFilter{Chain: run.Chain, Status: store.RunSucceeded, Limit: 50, NoOrigins: true})
		if err != nil || len(page.Runs) < 5 {
			out[run.Chain] = 0
			continue
		}
		ds := make([]time.Duration, 0, len(page.Runs))
		for _, r := range page.Runs {
			ds = append(ds, r.FinishedAt.Sub(r.CreatedAt))
		}
		slices.Sort(ds)
		out[run.Chain] = ds[len(ds)/2]
	}
	for k, d := range out {
		if d == 0 {
			delete(out, k)
		}
	}
	return out
}

// ---- Runs ----

type runsView struct {
	Chain, Status, Since, ID, Cursor, StartedBy string
	Chains                                      []string
	Statuses                                    []store.RunStatus
	// StartedKinds and StartedNamed are the started-by choices: every
	// kind, then each configured trigger and schedule.
	StartedKinds, StartedNamed []string
	// HideChains are the chains to hide, HideChoices the chains offered.
	HideChains, HideChoices []string
	// Labels are the label filters, KEY=VALUE or KEY, one field each.
	Labels  []string
	Runs    []*api.Run
	Damaged []api.DamagedRun
	Next    string
	// Query is the filters, encoded: as a URL, the template keeps it whole
	// rather than escaping it into one parameter.
	Query template.URL
	Live  bool
}

func (c *console) runsPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	q := r.URL.Query()
	cfg := c.host.Config()
	v := &runsView{Chain: q.Get("chain"), Status: q.Get("status"), Since: q.Get("since"), ID: strings.TrimSpace(q.Get("id")), Cursor: q.Get("cursor"),
		StartedBy: q.Get("started_by"), HideChains: q["hide_chain"], Chains: cfg.ChainNames, Statuses: runStatuses, StartedKinds: api.StartedKinds(), Labels: filledIn(q["label"])}
	v.Live = v.Cursor == ""
	for _, name := range cfg.TriggerNames {
		v.StartedNamed = append(v.StartedNamed, store.StartedByTrigger+":"+name)
	}
	for _, name := range cfg.ScheduleNames {
		v.StartedNamed = append(v.StartedNamed, store.StartedBySchedule+":"+name)
	}
	// A filter the config no longer offers (a trigger or chain since
	// removed) is still shown, so it can be seen and undone.
	if v.StartedBy != "" && !slices.Contains(v.StartedKinds, v.StartedBy) && !slices.Contains(v.StartedNamed, v.StartedBy) {
		v.StartedNamed = append(v.StartedNamed, v.StartedBy)
	}
	v.HideChoices = slices.Clone(cfg.ChainNames)
	for _, name := range v.HideChains {
		if !slices.Contains(v.HideChoices, name) {
			v.HideChoices = append(v.HideChoices, name)
		}
	}
	if v.ID != "" {
		if _, err := c.ops.Run(r.Context(), v.ID, false); err == nil {
			http.Redirect(w, r, c.base+"/runs/"+url.PathEscape(v.ID), http.StatusSeeOther)
			return
		}
	}
	since, err := api.ParseSince(v.Since)
	if err == nil {
		err = cmp.Or(api.CheckRunStatus(store.RunStatus(v.Status)), api.CheckStartedBy("started by", v.StartedBy), api.CheckHideChains("hide chain", v.HideChains))
	}
	var labels map[string]string
	if err == nil {
		labels, err = api.ParseLabels("label", v.Labels, false)
	}
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	page, err := c.listRuns(r.Context(), store.RunFilter{Chain: v.Chain, Status: store.RunStatus(v.Status), Since: since, Limit: runsPerPage, Cursor: v.Cursor, NoOrigins: true,
		StartedBy: v.StartedBy, HideChains: v.HideChains, Labels: labels}, v.ID)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	v.Runs, v.Damaged, v.Next = page.Runs, page.Damaged, page.Next
	// The filters go with the live list's refresh and the next page.
	keep := url.Values{"hide_chain": v.HideChains, "label": v.Labels}
	for _, k := range []string{"chain", "status", "since", "id", "started_by"} {
		if val := q.Get(k); val != "" {
			keep.Set(k, val)
		}
	}
	v.Query = template.URL(keep.Encode())
	c.livePage(w, r, sess, "runs-table", "runs.html", "Runs", "runs", v)
}

// runsPerPage is the size of a page of the runs list.
const runsPerPage = 50

// listRuns is a page of the runs f selects whose id starts with idStart. The
// store knows no such filter: it is read on, a thousand runs at a time, until
// the page is full or the runs run out, so that a search finds a run however
// old. The next page starts right after the page's last run.
func (c *console) listRuns(ctx context.Context, f store.RunFilter, idStart string) (api.RunPage, error) {
	if idStart == "" {
		return c.ops.ListRuns(ctx, f)
	}
	want := f.Limit
	var out api.RunPage
	for {
		f.Limit = api.MaxPageLimit
		page, err := c.ops.ListRuns(ctx, f)
		if err != nil {
			return api.RunPage{}, err
		}
		for _, d := range page.Damaged {
			if strings.HasPrefix(d.ID, idStart) {
				out.Damaged = append(out.Damaged, d)
			}
		}
		last := -1 // where in this page the last run taken is
		for i, run := range page.Runs {
			if !strings.HasPrefix(run.ID, idStart) {
				continue
			}
			if len(out.Runs) < want {
				out.Runs, last = append(out.Runs, run), i
				continue
			}
			// A run past the page's: there is a next page. Between the
			// pages lie no runs that match, so it may start where this
			// store page did, unless the last run taken is on it too.
			out.Next = f.Cursor
			if last >= 0 {
				f.Limit = last + 1
				cut, err := c.ops.ListRuns(ctx, f)
				if err != nil {
					return api.RunPage{}, err
				}
				out.Next = cut.Next
			}
			return out, nil
		}
		if page.Next == "" {
			return out, nil
		}
		f.Cursor = page.Next
	}
}

// ---- Run ----

type runView struct {
	View  *api.RunView
	Graph template.HTML
	// Running is the key of the first step running, where "jump to the
	// running step" leads: a long chain's graph is thousands of pixels tall.
	Running string
	// Timeline is the run's latest events, newest first, drawn as the
	// page's script draws those that arrive.
	Timeline template.HTML
	Omitted  int
	// AllEvents shows the whole timeline (up to maxAllEvents), not only
	// its latest events.
	AllEvents bool
	Final     bool
	Entries   []*api.DLQEntry
	// Labels are the run's labels, each linked to the runs with it.
	Labels []labelLink
	// Input is the run's payload as it is kept (secrets redacted), up to
	// maxShownInput bytes; InputSize is its whole size.
	Input     string
	InputSize int
	// Redrives are the splits whose failed or skipped items can run again.
	Redrives []redriveLine
	CanWrite bool
	CSRF     string
	Base     string
}

// The run page shows its run's latest events, and the whole timeline on
// request: most visits need the last few, and drawing hundreds of events
// is most of what a page costs the gateway.
const (
	maxTimeline  = 50
	maxAllEvents = 10000
)

// maxShownInput is as much of a run's payload as its page shows: a run
// may carry tens of MB.
const maxShownInput = 64 << 10

func (c *console) runView(ctx context.Context, id string, sess *uiSession, all bool) (*runView, error) {
	// The run and its steps are read once, for the page and its graph.
	v, err := c.ops.Run(ctx, id, false)
	if err != nil {
		return nil, err
	}
	def, err := c.host.Definition(ctx, v.Chain, v.ChainHash)
	if err != nil {
		return nil, err
	}
	d := v.DAG(def)
	rv := &runView{View: v, Final: v.Final(), CanWrite: c.canWrite(sess), CSRF: sess.csrf, Base: c.base, AllEvents: all}
	rv.Graph = c.graphSVG(d.Nodes, d.Edges, def, v, id) + c.handlerGraphs(d.Handlers, def, v, id)
	rv.Running = runningStep(d.Nodes, "")
	rv.Labels = c.labelLinks(v.Labels)
	rv.Redrives = redrives(v.Run, d.Nodes)
	if p := v.Origin.Payload; len(p) > maxShownInput {
		rv.Input, rv.InputSize = string(p[:maxShownInput]), len(p)
	} else {
		rv.Input, rv.InputSize = prettyJSON(p), len(p)
	}
	// The latest events only: a long run's whole log is the API's.
	after, shown := uint64(0), uint64(maxTimeline)
	if all {
		shown = maxAllEvents
	}
	if v.Seq > shown {
		after = v.Seq - shown
		rv.Omitted = int(after)
	}
	var events []api.Event
	err = c.ops.Events(ctx, id, after, false, func(ev api.Event) error {
		events = append(events, ev)
		return nil
	})
	if err != nil {
		return nil, err
	}
	rv.Timeline = timelineHTML(events)
	if v.Status == string(store.RunFailed) {
		entries, err := api.ListAllDLQ(ctx, c.ops, store.DLQFilter{Chain: v.Chain, Limit: maxConsoleDLQ})
		if err == nil {
			for _, e := range entries {
				if e.RunID == id {
					rv.Entries = append(rv.Entries, e)
				}
			}
		}
	}
	return rv, nil
}

// runningStep is the key of the first step running or waiting to retry,
// sub-steps included; empty when none is.
func runningStep(nodes []*api.DAGNode, prefix string) string {
	for _, n := range nodes {
		if n.Status == string(store.StepRunning) || n.Status == string(store.StepPending) {
			if k := runningStep(n.Children, prefix+n.Name+"/"); k != "" {
				return k
			}
			return prefix + n.Name
		}
	}
	return ""
}

func (c *console) runPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	rv, err := c.runView(r.Context(), r.PathValue("id"), sess, r.URL.Query().Get("events") == "all")
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.page(w, r, sess, "run.html", "Run "+rv.View.ID, "runs", rv)
}

// runLive is the part of the run page that changes, for the page's script
// to swap in when the run's events say something happened.
func (c *console) runLive(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	rv, err := c.runView(r.Context(), r.PathValue("id"), sess, r.URL.Query().Get("events") == "all")
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, http.StatusOK, "run-live", rv)
}

// consolePace is how often at most a page's stream is written to: news of
// a quiet run shows at once, and a busy run's page is redrawn once a
// second, as often as a person reads it, rather than at every commit.
const consolePace = time.Second

// runStream is the run's event stream, as the API serves it, for the
// page's EventSource.
func (c *console) runStream(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	c.host.ServeRunEvents(w, r, r.PathValue("id"), consolePace)
}

type stepView struct {
	RunID   string
	Record  *api.Step
	Waiting string
	Node    *chain.Step
	Items   bool
	Child   string
	Base    string
	// Asking is set while an approval step waits for its answer: what it
	// asks, and whether this session may answer.
	Asking   bool
	Question string
	CanWrite bool
	CSRF     string
}

func (c *console) stepPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	id, key := r.PathValue("id"), r.PathValue("key")
	v, err := c.ops.Run(r.Context(), id, false)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	rec := v.Steps[key]
	if rec == nil && store.IsItemKey(key) {
		// One record inside an item, not every item's; none yet is a step
		// not started.
		if rec, err = c.ops.Step(r.Context(), id, key); err != nil && !errors.Is(err, store.ErrNotFound) {
			c.failErr(w, r, err)
			return
		}
	}
	def, _ := c.host.Definition(r.Context(), v.Chain, v.ChainHash)
	if rec == nil {
		name := key[strings.LastIndexByte(key, '/')+1:]
		if def == nil || def.Step(name) == nil {
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("run %s has no step %q", id, key))
			return
		}
		rec = &api.Step{Key: key, Name: name, Status: "not_started"}
	}
	sv := &stepView{RunID: id, Record: rec, Base: c.base, Items: rec.Split != nil, Child: rec.Child}
	if def != nil {
		sv.Node = def.Step(rec.Name)
	}
	sv.Waiting = waitingOn(rec, sv.Node, v)
	// Past the deadline answers are refused: no buttons, though the step
	// waits for a gateway to apply its timeout.
	if sv.Node != nil && sv.Node.Kind == chain.KindApproval && rec.Status == string(store.StepRunning) && !v.Final() &&
		(rec.Deadline.IsZero() || time.Now().Before(rec.Deadline)) {
		var body struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(rec.Body, &body)
		sv.Asking, sv.Question, sv.CanWrite, sv.CSRF = true, body.Message, c.canWrite(sess), sess.csrf
	}
	if r.URL.Query().Get("fragment") == "1" {
		c.render(w, http.StatusOK, "step-panel", sv)
		return
	}
	c.page(w, r, sess, "step.html", "Step "+key, "runs", sv)
}

// waitingOn says what a running step waits for.
func waitingOn(rec *api.Step, def *chain.Step, v *api.RunView) string {
	if rec.Status != string(store.StepRunning) && rec.Status != string(store.StepPending) {
		return ""
	}
	switch {
	case !rec.NotBefore.IsZero() && time.Until(rec.NotBefore) > 0:
		return fmt.Sprintf("a timer (delay or retry backoff): it goes again at %s, in %s", rec.NotBefore.UTC().Format(time.RFC3339), time.Until(rec.NotBefore).Round(time.Second))
	case rec.Split != nil && rec.Split.Distributed:
		return fmt.Sprintf("workers: %d of %d items have a result", rec.Split.Succeeded+rec.Split.Failed+rec.Split.Skipped, rec.Split.Total)
	case rec.Split != nil:
		return fmt.Sprintf("its items: %d of %d have a result", rec.Split.Succeeded+rec.Split.Failed+rec.Split.Skipped, rec.Split.Total)
	case rec.Child != "":
		return "its sub-chain run " + rec.Child
	case def != nil && def.Kind == chain.KindApproval && rec.Status == string(store.StepRunning):
		switch left := time.Until(rec.Deadline); {
		case rec.Deadline.IsZero():
			return "a person's answer, approve or reject"
		case left <= 0:
			return fmt.Sprintf("its timeout to be applied: the deadline for an answer, %s, has passed", rec.Deadline.UTC().Format(time.RFC3339))
		default:
			return fmt.Sprintf("a person's answer, approve or reject, until %s (in %s)", rec.Deadline.UTC().Format(time.RFC3339), left.Round(time.Second))
		}
	case def != nil && def.Parallel != nil:
		done, pending := 0, []string{}
		for _, sub := range def.Parallel.Steps {
			if s := v.Steps[rec.Key+"/"+sub.Name]; s != nil && store.StepStatus(s.Status).Final() {
				done++
			} else {
				pending = append(pending, sub.Name)
			}
		}
		return fmt.Sprintf("join %s: %d of %d branches finished; still pending: %s", def.Parallel.Join, done, len(def.Parallel.Steps), strings.Join(pending, ", "))
	case rec.Status == string(store.StepRunning):
		return fmt.Sprintf("a provider call (attempt %d)", max(rec.Attempts, 1))
	}
	return "its turn"
}

type itemsView struct {
	RunID, Key, Status string
	Page               *api.ItemPage
	Prev, Next         int
	HasPrev, HasNext   bool
	Statuses           []string
	Base               string
}

// itemsPerPage is the size of a page of a split's items.
const itemsPerPage = 50

func (c *console) itemsPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	id, key := r.PathValue("id"), r.PathValue("key")
	q := r.URL.Query()
	status := q.Get("status")
	if status != "" && !store.StepStatus(status).Final() {
		c.fail(w, r, http.StatusBadRequest, "status must be succeeded, failed or skipped")
		return
	}
	offset, err := api.IntParam(q.Get("offset"), "offset", 0, 0, 1<<31-1)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	page, err := c.ops.SplitItems(r.Context(), id, key, status, offset, itemsPerPage)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	v := &itemsView{RunID: id, Key: key, Status: status, Page: page, Base: c.base, Statuses: []string{"succeeded", "failed", "skipped"},
		Prev: max(offset-itemsPerPage, 0), Next: offset + itemsPerPage, HasPrev: offset > 0, HasNext: offset+itemsPerPage < page.Matched}
	c.page(w, r, sess, "items.html", "Items of "+key, "runs", v)
}

func (c *console) cancelRun(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	id := r.PathValue("id")
	if err := c.ops.CancelRun(r.Context(), id); err != nil {
		c.failErr(w, r, err)
		return
	}
	http.Redirect(w, r, flashed(c.base+"/runs/"+url.PathEscape(id), "cancel-requested"), http.StatusSeeOther)
}

func (c *console) deleteRun(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	id := r.PathValue("id")
	if r.PostFormValue("confirm") != id {
		c.fail(w, r, http.StatusBadRequest, "type the run's id to confirm deleting it")
		return
	}
	if _, err := c.ops.DeleteRun(r.Context(), id); err != nil {
		c.failErr(w, r, err)
		return
	}
	http.Redirect(w, r, flashed(c.base+"/runs", "run-deleted"), http.StatusSeeOther)
}

func (c *console) replayRun(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	opts, err := api.ParseReplayOptions(r.PostFormValue("mode"), r.PostFormValue("definition"))
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	run, err := c.ops.ReplayRun(r.Context(), r.PathValue("id"), opts)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.replayed(w, r, run.ID, opts)
}

// replayed shows the run a replay carries on in.
func (c *console) replayed(w http.ResponseWriter, r *http.Request, runID string, opts engine.ReplayOptions) {
	http.Redirect(w, r, flashed(c.base+"/runs/"+url.PathEscape(runID), "replayed-"+string(opts.Mode)), http.StatusSeeOther)
}

// answer approves or rejects a waiting approval step from its panel.
func (c *console) answer(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	id, step := r.PathValue("id"), r.PathValue("step")
	decision, comment := r.PostFormValue("decision"), r.PostFormValue("comment")
	if decision != chain.DecisionApprove && decision != chain.DecisionReject {
		c.fail(w, r, http.StatusBadRequest, "decision must be approve or reject")
		return
	}
	if len(comment) > api.MaxComment {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("the comment is %d bytes; at most %d", len(comment), api.MaxComment))
		return
	}
	if _, err := c.ops.Signal(r.Context(), id, step, decision, comment); err != nil {
		c.failErr(w, r, err)
		return
	}
	if r.PostFormValue("back") == "approvals" {
		// The list drawn next no longer asks what was answered.
		c.answered(r.Context(), id, step)
		http.Redirect(w, r, flashed(c.base+"/approvals", "answered-"+decision), http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, flashed(c.base+"/runs/"+url.PathEscape(id), "answered-"+decision), http.StatusSeeOther)
}

// ---- Dead letters ----

type dlqView struct {
	Chain, Step, Text, Since string
	Chains                   []string
	Entries                  []*api.DLQEntry
	Matched                  int
	Shown                    int
	Filtered                 bool
	Query                    string
}

// dlqMatches lists the entries a console filter selects: the store's
// filter, and the error text on top.
func (c *console) dlqMatches(ctx context.Context, chainName, step, text, sinceArg string) ([]*api.DLQEntry, error) {
	since, err := api.ParseSince(sinceArg)
	if err != nil {
		return nil, err
	}
	entries, err := api.ListAllDLQ(ctx, c.ops, store.DLQFilter{Chain: chainName, Step: step, Since: since, Limit: maxConsoleDLQ})
	if err != nil {
		return nil, err
	}
	text = strings.ToLower(strings.TrimSpace(text))
	out := []*api.DLQEntry{}
	for _, e := range entries {
		if text == "" || strings.Contains(strings.ToLower(e.Error.Message), text) || strings.Contains(strings.ToLower(e.Error.Code), text) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (c *console) dlqPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	q := r.URL.Query()
	v := &dlqView{Chain: q.Get("chain"), Step: q.Get("step"), Text: q.Get("text"), Since: q.Get("since"), Chains: c.host.Config().ChainNames}
	v.Filtered = v.Chain != "" || v.Step != "" || v.Text != "" || v.Since != ""
	all, err := c.dlqMatches(r.Context(), v.Chain, v.Step, v.Text, v.Since)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	v.Matched = len(all)
	v.Entries = all[:min(len(all), 200)]
	v.Shown = len(v.Entries)
	c.page(w, r, sess, "dlq.html", "Dead letters", "dlq", v)
}

func (c *console) dlqEntryPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	e, err := c.ops.DLQEntry(r.Context(), r.PathValue("id"))
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.page(w, r, sess, "dlq-entry.html", "Dead letter "+e.ID, "dlq", e)
}

func (c *console) replayEntry(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	opts, err := api.ParseReplayOptions(r.PostFormValue("mode"), r.PostFormValue("definition"))
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	run, err := c.ops.Replay(r.Context(), r.PathValue("id"), opts)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	if run.ID == "" {
		http.Redirect(w, r, flashed(c.base+"/dlq", "entry-skipped"), http.StatusSeeOther)
		return
	}
	c.replayed(w, r, run.ID, opts)
}

func (c *console) deleteEntry(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	id := r.PathValue("id")
	if r.PostFormValue("confirm") != id {
		c.fail(w, r, http.StatusBadRequest, "type the entry's id to confirm deleting it")
		return
	}
	if err := c.ops.DeleteDLQ(r.Context(), id); err != nil {
		c.failErr(w, r, err)
		return
	}
	http.Redirect(w, r, flashed(c.base+"/dlq", "entry-deleted"), http.StatusSeeOther)
}

// jobKept is how long a finished bulk action's page stays.
const jobKept = time.Hour

// bulkJob is a bulk replay or purge under way, for its progress page.
type bulkJob struct {
	Action string
	// Filter is the filter's query, encoded, for the link to what it
	// selects now.
	Filter              template.URL
	Total, Done, Failed int
	FirstErr            string
	// The runs the replays carry on in, by how they ended: a replay
	// accepted is not a success until its run is one, and one that fails
	// again is likely back among the dead letters.
	Succeeded, FailedAgain, Cancelled, Running int
	Finished                                   bool
	Started, FinishedAt                        time.Time
}

// bulkDLQ replays or purges every entry a filter selects, once the form
// confirms how many that is: the number typed must be the number the
// filter selects now. The work goes on in the background; its page shows
// how far it is.
func (c *console) bulkDLQ(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	chainName, step, text, since := r.PostFormValue("chain"), r.PostFormValue("step"), r.PostFormValue("text"), r.PostFormValue("since")
	if chainName == "" && step == "" && text == "" && since == "" {
		c.fail(w, r, http.StatusBadRequest, "give a filter (chain, step, error text or age): an empty filter would act on every entry")
		return
	}
	action := r.PostFormValue("action")
	if action != "replay" && action != "purge" {
		c.fail(w, r, http.StatusBadRequest, "action must be replay or purge")
		return
	}
	opts, err := api.ParseReplayOptions(r.PostFormValue("mode"), "")
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	matched, err := c.dlqMatches(r.Context(), chainName, step, text, since)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	if n, err := strconv.Atoi(strings.TrimSpace(r.PostFormValue("confirm"))); err != nil || n != len(matched) {
		c.fail(w, r, http.StatusConflict, fmt.Sprintf("the filter selects %d entries now; type that number to confirm", len(matched)))
		return
	}
	filter := url.Values{}
	for k, v := range map[string]string{"chain": chainName, "step": step, "text": text, "since": since} {
		if v != "" {
			filter.Set(k, v)
		}
	}
	job := &bulkJob{Action: action, Filter: template.URL(filter.Encode()), Total: len(matched), Started: time.Now()}
	id := randomToken()[:16]
	c.mu.Lock()
	for k, j := range c.jobs {
		if j.Finished && time.Since(j.FinishedAt) > jobKept {
			delete(c.jobs, k)
		}
	}
	c.jobs[id] = job
	c.mu.Unlock()
	// The work outlives the request, up to the server's shutdown; who
	// asked for it stays on it.
	ctx, cancel := context.WithTimeout(c.host.Stopping(), api.BulkTimeout)
	ctx = engine.WithActor(ctx, engine.Actor(r.Context()))
	if id, ok := engine.IdentityOf(r.Context()); ok {
		ctx = engine.WithIdentity(ctx, id)
	}
	go func() {
		defer cancel()
		// Watched from before the first replay, so that no run's end is
		// missed.
		watch := c.host.WatchRuns()
		defer watch.Close()
		running := map[string]bool{}
		for _, e := range matched {
			if ctx.Err() != nil {
				break
			}
			var err error
			if action == "replay" {
				var run *api.Run
				if run, err = c.ops.Replay(ctx, e.ID, opts); err == nil && run.ID != "" {
					running[run.ID] = true
				}
			} else {
				err = c.ops.DeleteDLQ(ctx, e.ID)
			}
			c.mu.Lock()
			if err != nil {
				job.Failed++
				if job.FirstErr == "" {
					job.FirstErr = err.Error()
				}
			} else {
				job.Done++
			}
			job.Running = len(running)
			c.mu.Unlock()
		}
		c.followReplays(ctx, job, running, watch)
		c.mu.Lock()
		job.Finished, job.FinishedAt = true, time.Now()
		c.mu.Unlock()
	}()
	http.Redirect(w, r, c.base+"/dlq-jobs/"+id, http.StatusSeeOther)
}

// followReplays counts the replayed runs as they end, until all have or ctx
// ends.
func (c *console) followReplays(ctx context.Context, job *bulkJob, running map[string]bool, watch *events.RunWatch) {
	check := func(id string) {
		run, err := c.ops.RunHeader(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound): // deleted meanwhile: nothing to count
		case err != nil, !run.Final():
			return
		}
		delete(running, id)
		c.mu.Lock()
		switch {
		case run == nil:
		case run.Status == string(store.RunSucceeded):
			job.Succeeded++
		case run.Status == string(store.RunCancelled):
			job.Cancelled++
		default:
			job.FailedAgain++
		}
		job.Running = len(running)
		c.mu.Unlock()
	}
	checkAll := func() {
		for id := range running {
			check(id)
		}
	}
	checkAll()
	// The tick catches an end the stream of statuses lost.
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for len(running) > 0 {
		select {
		case <-ctx.Done():
			return
		case ev := <-watch.C:
			if watch.Lost() || ev.RunID == "" {
				checkAll()
			} else if running[ev.RunID] {
				check(ev.RunID)
			}
		case <-tick.C:
			checkAll()
		}
	}
}

// jobPage shows a bulk action's progress; it refreshes itself until the
// action is done.
func (c *console) jobPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	c.mu.Lock()
	job := c.jobs[r.PathValue("id")]
	var snap bulkJob
	if job != nil {
		snap = *job
	}
	c.mu.Unlock()
	if job == nil {
		c.fail(w, r, http.StatusNotFound, "no such bulk action: a finished one is kept for an hour, and none survives a restart")
		return
	}
	c.page(w, r, sess, "dlq-job.html", "Bulk "+snap.Action, "dlq", &snap)
}

// ---- Chains ----

type chainLine struct {
	Name, Hash string
	Steps      int
	Providers  []string
}

func (c *console) chainsPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	cfg := c.host.Config()
	var out []chainLine
	for _, name := range cfg.ChainNames {
		ch := cfg.Chains[name]
		out = append(out, chainLine{Name: name, Hash: ch.Hash, Steps: len(ch.Steps), Providers: cfg.ProvidersUsed(name)})
	}
	ps, err := c.pausables(r.Context())
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.page(w, r, sess, "chains.html", "Chains", "chains", map[string]any{"Chains": out, "ReloadError": c.host.LastReloadError(), "Pausables": ps})
}

type chainView struct {
	Name, Hash string
	Graph      template.HTML
	Lines      []string
	// StartedBy says what starts the chain besides the API: its triggers
	// (and those that start it when an alert resolves) and schedules,
	// each with its pause if it is paused.
	StartedBy []startedByLine
	// Form starts a run of the chain; Example is a payload of its fields,
	// for the API call that does the same.
	Form    *runForm
	Example string
}

// startedByLine is one trigger or schedule that starts a chain.
type startedByLine struct {
	Text  string
	Pause *api.Pause
}

func (c *console) chainPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	c.chainPageWith(w, r, sess, r.PathValue("name"), nil, http.StatusOK)
}

// chainPageWith draws a chain's page with its run form as given (empty
// when nil), answering status.
func (c *console) chainPageWith(w http.ResponseWriter, r *http.Request, sess *uiSession, name string, form *runForm, status int) {
	cfg := c.host.Config()
	ch := cfg.Chains[name]
	if ch == nil {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no chain %q%s", name, cfg.ChainHint(name)))
		return
	}
	src, err := cfg.Outline(name)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	paused := map[string]*api.Pause{}
	if ps, err := c.ops.Pauses(r.Context()); err == nil {
		for _, p := range ps {
			paused[p.Kind+"\x00"+p.Name] = p
		}
	}
	g := ch.Graph()
	v := &chainView{Name: name, Hash: ch.Hash, Lines: strings.Split(strings.TrimRight(string(src), "\n"), "\n"), Form: cmp.Or(form, newRunForm(ch))}
	v.Example = v.Form.example()
	v.Graph = c.graphSVG(dagOf(g.Nodes), g.Edges, ch, nil, "") + c.handlerGraphs(chainHandlers(g), ch, nil, "")
	for _, tn := range cfg.TriggerNames {
		switch tr := cfg.Triggers[tn]; name {
		case tr.Chain:
			v.StartedBy = append(v.StartedBy, startedByLine{fmt.Sprintf("trigger %s (%s): POST /v1/triggers/%s", tn, tr.Type, tn), paused[api.PauseTrigger+"\x00"+tn]})
		case tr.ResolveChain:
			v.StartedBy = append(v.StartedBy, startedByLine{fmt.Sprintf("trigger %s (%s), when an alert resolves", tn, tr.Type), paused[api.PauseTrigger+"\x00"+tn]})
		}
	}
	for _, sn := range cfg.ScheduleNames {
		if s := cfg.Schedules[sn]; s.Chain == name {
			when := "cron " + s.Cron + " " + s.Location.String()
			if s.Every > 0 {
				when = "every " + s.Every.String()
			}
			if next := s.Next(time.Now()); !next.IsZero() {
				when += ", next at " + next.In(s.Location).Format("2006-01-02 15:04 MST")
			}
			v.StartedBy = append(v.StartedBy, startedByLine{"schedule " + sn + ": " + when, paused[api.PauseSchedule+"\x00"+sn]})
		}
	}
	c.pageStatus(w, r, sess, status, "chain.html", "Chain "+name, "chains", v)
}

// dagOf is a chain's graph as DAG nodes without a run.
func dagOf(nodes []*chain.Node) []*api.DAGNode {
	out := make([]*api.DAGNode, len(nodes))
	for i, n := range nodes {
		out[i] = &api.DAGNode{Name: n.Name, Kind: n.Kind, Provider: n.Provider, Join: n.Join, Children: dagOf(n.Children)}
	}
	return out
}

// timelineHTML draws events newest first, as <li> elements like those the
// page's script adds: hundreds of them through the template engine were
// most of what rendering a run page cost.
func timelineHTML(events []api.Event) template.HTML {
	var b strings.Builder
	var buf [20]byte
	for i := len(events) - 1; i >= 0; i-- {
		ev := events[i]
		b.WriteString(`<li class="ev ev-`)
		escTo(&b, ev.Type)
		b.WriteString(`"><span class="t">`)
		b.WriteString(ev.Time.UTC().Format("2006-01-02 15:04:05.000Z"))
		b.WriteString(`</span> <span class="type">`)
		escTo(&b, ev.Type)
		b.WriteString(`</span>`)
		if ev.Step != "" {
			b.WriteString(` <span class="step">`)
			escTo(&b, ev.Step)
			b.WriteString(`</span>`)
		}
		if ev.Attempt > 1 {
			b.WriteString(` (attempt `)
			b.Write(strconv.AppendInt(buf[:0], int64(ev.Attempt), 10))
			b.WriteString(`)`)
		}
		if ev.Message != "" {
			b.WriteString(`: `)
			escTo(&b, ev.Message)
		}
		b.WriteString("</li>\n")
	}
	return template.HTML(b.String())
}

type auditView struct {
	Filter api.AuditFilter
	Since  string
	Page   api.AuditPage
	// More is the query of the next page: built by url.Values, so
	// trusted as a URL's query, which the template would escape whole.
	More     template.URL
	Actions  []authz.Action
	Outcomes []string
}

// auditPage shows the audit log, newest first, a hundred entries a page.
func (c *console) auditPage(w http.ResponseWriter, r *http.Request, sess *uiSession) {
	q := r.URL.Query()
	f, err := api.ParseAuditFilter(q)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	page, err := c.ops.ListAudit(r.Context(), f)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	v := &auditView{Filter: f, Since: q.Get("since"), Page: page, Actions: authz.Actions(), Outcomes: []string{store.AuditOK, store.AuditDenied, store.AuditFailed}}
	if page.Next != "" {
		more := f
		more.Cursor = page.Next
		v.More = template.URL(more.Values().Encode())
	}
	c.page(w, r, sess, "audit.html", "Audit log", "audit", v)
}
