package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// tourConfig adds what the tour of the console's pages needs besides the
// console's chains: a run waiting at an approval step, and a schedule.
const tourConfig = `
[[chains]]
name = "restart-db"
[[chains.steps]]
name = "ask"
approval = { message = "Restart <<origin.payload.host>>?" }
[[chains.steps]]
name = "restart"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>" }

[[schedules]]
name = "nightly-restart"
chain = "restart-db"
cron = "0 3 * * *"
payload = { host = "db-1" }
`

// consoleTour is a gateway with something on every console page, and the
// pages' addresses by name: a run with labels waiting for an answer, one
// with a deadline, a split with failed and skipped items to redrive, a
// paused schedule, a chain's run form.
func consoleTour(t *testing.T) (*apiEnv, map[string]string) {
	t.Helper()
	env := newActionsAPI(t, "")
	hello := startWait(t, env, "hello", `{"who": "ops"}`)
	fleet := startWait(t, env, "fleet", fleetPayload(12, 2, 7, 9))
	for range 2 {
		startWait(t, env, "breaks", `{}`)
	}
	ask := startLabelled(t, env, "restart-db", `{"host": "db-1"}`, "alertname=PrimaryDatabaseUnreachable", "instance=db-1.prod.example.com:9100", "team=dba")
	waitAsking(t, env, ask, "ask")
	change := startRun(t, env, "change", `{"what": "the firewall"}`)
	waitAsking(t, env, change, "approve-change")
	patch := startWait(t, env, "patch", patchPayload(8, []int{1, 5}, []int{3}))
	if code, _, body := env.call("POST", "/v1/pauses/schedule/nightly-restart", `{"reason": "the database's maintenance window, until the new primary is in"}`, nil, nil); code != http.StatusCreated {
		t.Fatalf("pausing: %d %s", code, body)
	}
	entry := dlqIDs(t, env, "breaks")[0]
	// A bulk replay whose replays fail again, for its progress page.
	b := newBrowser(t, env)
	b.get("/ui/dlq?chain=breaks")
	code, job, body := b.post("/ui/dlq-bulk", url.Values{"action": {"replay"}, "mode": {"resume"}, "chain": {"breaks"}, "confirm": {"2"}})
	if code != http.StatusSeeOther {
		t.Fatalf("bulk replay: %d %s", code, body)
	}
	return env, map[string]string{
		"now": "/ui/", "runs": "/ui/runs", "run": "/ui/runs/" + hello, "split run": "/ui/runs/" + fleet,
		"approval run": "/ui/runs/" + ask, "approval step": "/ui/runs/" + ask + "/steps/ask", "items": "/ui/runs/" + fleet + "/items/check",
		"dlq": "/ui/dlq", "bulk replay": "/ui/dlq?chain=breaks", "dlq entry": "/ui/dlq/" + entry, "bulk progress": job,
		"chains": "/ui/chains", "chain": "/ui/chains/hello", "scheduled chain": "/ui/chains/restart-db", "not found": "/ui/runs/01nosuchrun",
		"approvals": "/ui/approvals", "redrive run": "/ui/runs/" + patch, "runs by label": "/ui/runs?label=team%3Ddba&label=instance",
		"run form": "/ui/chains/deploy",
	}
}

// phone is a phone's viewport, 390 × 844 CSS pixels.
var phone = chromedp.EmulateViewport(390, 844, chromedp.EmulatePortrait)

// fits opens the page at u and finds it no wider than the screen: on a
// phone's viewport, nothing scrolls sideways.
func fits(t *testing.T, ctx context.Context, name, u string) {
	t.Helper()
	do(t, ctx, "opening "+name, chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS("main")))
	w := eval[[]int](t, ctx, `[document.documentElement.scrollWidth, window.innerWidth]`)
	t.Logf("%s: %d px wide on a %d px screen", name, w[0], w[1])
	if w[0] > w[1] {
		t.Errorf("%s (%s) is %d px wide on a %d px screen", name, u, w[0], w[1])
	}
}

// darkMode emulates prefers-color-scheme: dark, or undoes it.
func darkMode(on bool) chromedp.Action[chromedp.Void] {
	value := "light"
	if on {
		value = "dark"
	}
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: value}}})
		return err
	})
}

// TestBrowserPhoneWidth opens every page at a phone's width: none scrolls
// sideways, the runs list still shows each run's id, chain, status and
// error, and a step's panel, where an approval is answered, takes the
// screen's width.
func TestBrowserPhoneWidth(t *testing.T) {
	t.Parallel()
	env, pages := consoleTour(t)
	signIn := newConsoleAPI(t, "[gateway.auth]\ntokens = [\"write-tok\"]\n")
	ctx := chrome(t)
	do(t, ctx, "a phone's viewport", phone)
	for name, p := range pages {
		fits(t, ctx, name, env.url+p)
	}
	fits(t, ctx, "sign in", signIn.url+"/ui/login")
	do(t, ctx, "a run the chain's input refuses", chromedp.Navigate(env.url+pages["run form"]), chromedp.WaitVisible(chromedp.CSS("#run-start")),
		chromedp.Click(chromedp.CSS("#run-start")), chromedp.WaitVisible(chromedp.CSS("#run-error")))
	if w := eval[[]int](t, ctx, `[document.documentElement.scrollWidth, window.innerWidth]`); w[0] > w[1] {
		t.Errorf("the refused run form is %d px wide on a %d px screen", w[0], w[1])
	}

	do(t, ctx, "opening the runs", chromedp.Navigate(env.url+pages["runs"]), chromedp.WaitVisible(chromedp.CSS("#runs")))
	// Each row's id, chain, status and error, on the screen.
	hidden := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#runs tr[data-status]')).flatMap(tr => [0, 1, 2, 6].map(i => tr.cells[i]).filter(td => {
	  const r = td.getBoundingClientRect();
	  return td.textContent.trim() !== '' && (r.width === 0 || r.left < 0 || r.right > window.innerWidth);
	}).map(td => tr.rowIndex + ':' + td.cellIndex))`)
	if len(hidden) > 0 {
		t.Errorf("cells of the runs list off the screen (row:cell): %v", hidden)
	}

	do(t, ctx, "opening the approval step's panel", chromedp.Navigate(env.url+pages["approval run"]), chromedp.WaitVisible(chromedp.CSS("svg.graph")),
		chromedp.Click(chromedp.CSS(`a.node[data-key="ask"]`)), chromedp.WaitVisible(chromedp.CSS("#answer-comment")))
	if w := eval[[]int](t, ctx, `[document.getElementById('panel').getBoundingClientRect().width, document.getElementById('answer-comment').getBoundingClientRect().right, window.innerWidth].map(Math.round)`); w[0] < w[2]*9/10 || w[1] > w[2] {
		t.Errorf("the approval panel is %d px wide on a %d px screen, its comment ending at %d px", w[0], w[2], w[1])
	}
}

// contrastJS measures, for every element sel selects, the contrast ratio
// (WCAG 2) of its text's color against the background it is drawn on, as
// Chromium computes them: {label: ratio}.
const contrastJS = `((sel) => {
  const rgba = (s) => { const m = s.match(/[\d.]+/g).map(Number); return m.length === 3 ? m.concat(1) : m; };
  const over = (top, under) => top.slice(0, 3).map((c, i) => c * top[3] + under[i] * (1 - top[3])).concat(1);
  const background = (el) => {
    const layers = [];
    for (; el; el = el.parentElement) {
      const c = rgba(getComputedStyle(el).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] === 1) break;
    }
    return layers.reduceRight((under, top) => over(top, under), [255, 255, 255, 1]);
  };
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const out = {};
  for (const el of document.querySelectorAll(sel)) {
    const bg = background(el), fg = over(rgba(getComputedStyle(el).color), bg);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    out[el.className + ' "' + el.textContent.trim() + '"'] = Math.round((a + 0.05) / (b + 0.05) * 100) / 100;
  }
  return out;
})`

// everyStatus are the statuses a pill can show: a run's, a step's and an
// item's.
var everyStatus = []string{"running", "waiting", "pending", "succeeded", "failed", "cancelled", "timed_out", "skipped", "not_started"}

// TestBrowserStatusContrast measures each status pill's text against its
// background, and the other coloured text of a few pages, in light and dark
// mode: every one reaches WCAG AA (4.5:1).
func TestBrowserStatusContrast(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	startWait(t, env, "hello", `{"who": "ops"}`)
	failed := startWait(t, env, "breaks", `{}`)
	ask := startLabelled(t, env, "restart-db", `{"host": "db-1"}`, "host=db-1")
	waitAsking(t, env, ask, "ask")
	if code, _, body := env.call("POST", "/v1/pauses/schedule/nightly-restart", `{"reason": "maintenance"}`, nil, nil); code != http.StatusCreated {
		t.Fatalf("pausing: %d %s", code, body)
	}
	ctx := chrome(t)
	// A pill of every status, as the status template writes them, and the
	// run page's badge in each state, beside those the runs list shows.
	var pills strings.Builder
	for _, s := range everyStatus {
		pills.WriteString(`<span class="status st-` + s + `">` + s + `</span>`)
	}
	for _, s := range []string{"connecting", "live", "reconnecting", "polling", "ended"} {
		pills.WriteString(`<span class="badge" data-state="` + s + `">` + s + `</span>`)
	}
	const text = `header a, header .who, main a, .quiet, .err, .error-msg, .flash, th, ol.timeline .type, ol.timeline .t, a.label, .warn, .req, .form-error p, td.question`
	for _, dark := range []bool{false, true} {
		mode := map[bool]string{false: "light", true: "dark"}[dark]
		do(t, ctx, "opening the runs in "+mode+" mode", darkMode(dark), chromedp.Navigate(env.url+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#runs")))
		eval[bool](t, ctx, `document.querySelector('main').insertAdjacentHTML('beforeend', `+"`<p id=\"pills\">"+pills.String()+"</p>`"+`) || true`)
		ratios := eval[map[string]float64](t, ctx, contrastJS+`('.status, .badge')`)
		for _, s := range everyStatus {
			if _, ok := ratios[`status st-`+s+` "`+s+`"`]; !ok {
				t.Errorf("%s mode: no pill of status %s measured", mode, s)
			}
		}
		for pill, ratio := range ratios {
			t.Logf("%s mode: %s %.2f:1", mode, pill, ratio)
			if ratio < 4.5 {
				t.Errorf("%s mode: %s has a contrast of %.2f:1, under 4.5:1", mode, pill, ratio)
			}
		}
		for _, p := range []string{"/ui/runs", "/ui/runs/" + failed, "/ui/dlq", "/ui/chains/hello", "/ui/runs/" + ask, "/ui/approvals", "/ui/chains", "/ui/chains/deploy", "/ui/"} {
			do(t, ctx, "opening "+p, chromedp.Navigate(env.url+p), chromedp.WaitVisible(chromedp.CSS("main")))
			for el, ratio := range eval[map[string]float64](t, ctx, contrastJS+"(`"+text+"`)") {
				if ratio < 4.5 {
					t.Errorf("%s mode, %s: %s has a contrast of %.2f:1, under 4.5:1", mode, p, el, ratio)
				}
			}
		}
	}
}

// axNames are the accessible names Chromium gives the page's elements of a
// role ("link", "list", "textbox", ...), in the order of its
// accessibility tree.
func axNames(t *testing.T, ctx context.Context, role string) []string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tree, err := chromedp.Run(sctx, func(ctx context.Context, t *chromedp.Target) (accessibility.GetFullAXTreeResult, error) {
		return cdp.Call(ctx, t, accessibility.GetFullAXTree, accessibility.GetFullAXTreeParams{})
	})
	if err != nil {
		t.Fatalf("reading the accessibility tree: %v", err)
	}
	var out []string
	for _, n := range tree.Nodes {
		var r, name string
		if n.Ignored || n.Role == nil || json.Unmarshal(n.Role.Value, &r) != nil || r != role {
			continue
		}
		if n.Name != nil {
			_ = json.Unmarshal(n.Name.Value, &name)
		}
		out = append(out, name)
	}
	return out
}

// activeKey is the data-key of the element with the focus, if it has one.
const activeKey = `(document.activeElement && document.activeElement.dataset && document.activeElement.dataset.key) || ''`

// TestBrowserGraphByKeyboard walks a run's graph with Tab: each step,
// sub-steps too, is a link named with its status in the accessibility
// tree; Enter opens its panel with the focus in it, and Escape gives the
// focus back to the step.
func TestBrowserGraphByKeyboard(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "")
	id := startWait(t, env, "hello", `{"who": "ops"}`)
	ctx := chromeAlone(t)
	do(t, ctx, "opening the run", chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("svg.graph")))
	var reached []string
	for range 40 {
		do(t, ctx, "pressing Tab", chromedp.KeyEvent(kb.Tab))
		if k := eval[string](t, ctx, activeKey); k != "" && (len(reached) == 0 || reached[len(reached)-1] != k) {
			reached = append(reached, k)
		}
		if len(reached) == 4 {
			break
		}
	}
	if strings.Join(reached, ",") != "greet,notify,notify/a,notify/b" {
		t.Errorf("Tab reaches the steps %v, want greet, notify, notify/a and notify/b in order", reached)
	}
	if lists := axNames(t, ctx, "list"); !slices.Contains(lists, "steps of the run") || !slices.Contains(lists, "steps of group notify") {
		t.Errorf("the graph's lists: %q", lists)
	}
	links := strings.Join(axNames(t, ctx, "link"), "\n")
	for _, want := range []string{"greet: succeeded · provider · echo", "notify: succeeded · parallel · join all", "a: succeeded · provider · echo", "b: succeeded · provider · faulty"} {
		if !strings.Contains(links, want) {
			t.Errorf("no link is named %q; the links:\n%s", want, links)
		}
	}

	// Enter on the focused step opens its panel; on a loaded machine the
	// page may still be redrawing the graph from its events when the key
	// comes, so the key is pressed again until the panel opens.
	for try := 1; ; try++ {
		do(t, ctx, "focusing greet", chromedp.Focus(chromedp.CSS(`a.node[data-key="greet"]`)), chromedp.KeyEvent(kb.Enter))
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := chromedp.Do(wctx, chromedp.WaitVisible(chromedp.CSS("#panel .step-panel")))
		cancel()
		if err == nil {
			break
		}
		if try == 6 {
			t.Fatalf("opening greet's panel by keyboard: %v", err)
		}
	}
	poll(t, ctx, "the focus in the panel", `document.activeElement.closest('#panel') !== null`)
	do(t, ctx, "closing it", chromedp.KeyEvent(kb.Escape))
	poll(t, ctx, "the focus back on the step", activeKey+` === 'greet' && document.getElementById('panel').hidden`)
}

// longWaitConfig is a chain of 300 steps whose 250th waits for a person.
func longWaitConfig() string {
	var b strings.Builder
	b.WriteString("\n[[chains]]\nname = \"long-wait\"\n")
	for i := range 300 {
		if i == 249 {
			b.WriteString("[[chains.steps]]\nname = \"ask\"\napproval = { message = \"go on?\" }\n")
			continue
		}
		fmt.Fprintf(&b, "[[chains.steps]]\nname = \"s%03d\"\nprovider = \"echo\"\n", i)
	}
	return b.String()
}

// TestBrowserJumpToRunningStep opens a 300-step run waiting at its 250th
// step: "jump to the running step" scrolls to it and gives it the focus;
// once it is answered, its name says so without a reload.
func TestBrowserJumpToRunningStep(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, longWaitConfig())
	id := startRun(t, env, "long-wait", `{}`)
	waitAsking(t, env, id, "ask")
	ctx := chromeAlone(t)
	do(t, ctx, "jumping to the running step", chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("#jump-running")),
		chromedp.Click(chromedp.CSS("#jump-running")))
	poll(t, ctx, "the focus on the waiting step", activeKey+` === 'ask'`)
	if r := eval[[]int](t, ctx, `(r => [r.top, r.bottom, window.innerHeight].map(Math.round))(document.activeElement.getBoundingClientRect())`); r[0] < 0 || r[1] > r[2] {
		t.Errorf("the step is at %d–%d px, outside the window's %d px", r[0], r[1], r[2])
	}
	if h := eval[int](t, ctx, `Math.round(document.querySelector('svg.graph').getBoundingClientRect().height)`); h < 10000 {
		t.Errorf("the graph is %d px tall; the test wants one too tall to find the step by eye", h)
	}
	if code, _, body := env.call("POST", "/v1/runs/"+id+"/signals/ask", `{"decision": "approve"}`, nil, nil); code != http.StatusAccepted {
		t.Fatalf("approving: %d %s", code, body)
	}
	poll(t, ctx, "the step's name saying it succeeded", `document.querySelector('a.node[data-key="ask"]').getAttribute('aria-label').startsWith('ask: succeeded · approval')`)
}

// unlabelledJS lists the form fields a person fills in that have no label
// of their own: a <label>, aria-label or aria-labelledby (a placeholder is
// no label: it goes once something is typed).
const unlabelledJS = `Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea')).filter(el =>
  !Array.from(el.labels || []).some(l => l.textContent.trim() !== '') && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby')
).map(el => el.outerHTML)`

// formRoles are the roles of the accessibility tree a form field has.
var formRoles = []string{"textbox", "searchbox", "combobox", "listbox", "checkbox", "radio", "spinbutton", "slider"}

// TestBrowserEveryFieldLabelled opens every page, and the approval panel,
// and finds no form field without a label, by the page's markup or in
// Chromium's accessibility tree.
func TestBrowserEveryFieldLabelled(t *testing.T) {
	t.Parallel()
	env, pages := consoleTour(t)
	signIn := newConsoleAPI(t, "[gateway.auth]\ntokens = [\"write-tok\"]\n")
	ctx := chrome(t)
	check := func(what string) {
		t.Helper()
		if bare := eval[[]string](t, ctx, unlabelledJS); len(bare) > 0 {
			t.Errorf("%s: fields without a label: %v", what, bare)
		}
		for _, role := range formRoles {
			for _, name := range axNames(t, ctx, role) {
				if strings.TrimSpace(name) == "" {
					t.Errorf("%s: a %s without an accessible name", what, role)
				}
			}
		}
	}
	for name, p := range pages {
		do(t, ctx, "opening "+name, chromedp.Navigate(env.url+p), chromedp.WaitVisible(chromedp.CSS("main")))
		check(name)
	}
	do(t, ctx, "opening the approval panel", chromedp.Navigate(env.url+pages["approval run"]), chromedp.WaitVisible(chromedp.CSS("svg.graph")),
		chromedp.Click(chromedp.CSS(`a.node[data-key="ask"]`)), chromedp.WaitVisible(chromedp.CSS("#answer-comment")))
	check("the approval panel")
	do(t, ctx, "a run the chain's input refuses", chromedp.Navigate(env.url+pages["run form"]), chromedp.WaitVisible(chromedp.CSS("#run-start")),
		chromedp.Click(chromedp.CSS("#run-start")), chromedp.WaitVisible(chromedp.CSS("#run-error")))
	check("the refused run form")
	do(t, ctx, "opening the sign-in page", chromedp.Navigate(signIn.url+"/ui/login"), chromedp.WaitVisible(chromedp.CSS("input[name=token]")))
	check("sign in")
}
