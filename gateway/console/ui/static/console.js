// The console's script: it follows a run live and keeps the runs list
// fresh. Pages work without it; it only spares the reloads.
"use strict";

(function () {
  const pollEvery = 2000; // while the stream is broken
  const timelineMax = 200;

  // swap replaces el's content with the HTML at url, when it answers.
  async function swap(el, url) {
    const resp = await fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } });
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    el.innerHTML = await resp.text();
  }

  const stepStatus = {
    step_started: "running", step_succeeded: "succeeded", step_failed: "failed", step_skipped: "skipped",
    step_retrying: "pending", step_timed_out: "timed-out", step_cancelled: "cancelled",
  };
  const runEnds = ["run_succeeded", "run_failed", "run_cancelled", "run_timed_out", "run_skipped"];

  // followRun keeps the run page current. Each event from the run's stream
  // is applied where it lands (a node's status, a split's bar, a line of
  // the timeline); the server renders the whole again only when the run
  // ends, when the stream comes back after a break, and every two seconds
  // while it is broken.
  function followRun(live) {
    const badge = document.getElementById("badge");
    const setBadge = (state) => { badge.dataset.state = state; badge.textContent = state; };
    let source = null, poller = null, retry = null, brokenSince = 0, pending = false, opened = false;
    let panelFollows = () => {};
    const meta = () => live.querySelector(".run-meta");
    const ended = () => meta() !== null && meta().dataset.final === "true";

    async function refresh() {
      if (pending) return;
      pending = true;
      setTimeout(async () => {
        try { await swap(live, live.dataset.live); } catch (e) { /* the next event or poll tries again */ }
        pending = false;
        if (ended()) stop();
      }, 250);
    }

    function stop() {
      if (source) source.close();
      clearInterval(poller);
      clearTimeout(retry);
      source = poller = retry = null;
      setBadge("ended");
    }

    function nodeOf(key) {
      for (const n of live.querySelectorAll("[data-key]")) {
        if (n.dataset.key === key && !n.classList.contains("split-bar")) return n;
      }
      return null;
    }

    // setBar moves a split's bar; false when the split's node has none yet
    // (the page was rendered before the split counted its items).
    function setBar(key, d) {
      let bar = null;
      for (const b of live.querySelectorAll(".split-bar")) if (b.dataset.key === key) bar = b;
      if (!d.total) return true;
      if (!bar) return nodeOf(key) === null;
      const x = +bar.dataset.x, w = +bar.dataset.w, total = d.total;
      const processed = d.succeeded + d.failed + d.skipped;
      const parts = { succeeded: d.succeeded, failed: d.failed, skipped: d.skipped, running: 0, pending: total - processed };
      let at = x;
      for (const cls of ["succeeded", "failed", "skipped", "running", "pending"]) {
        const r = bar.querySelector("rect.bar." + cls);
        if (!r) continue;
        const pw = cls === "pending" ? x + w - at : Math.floor(parts[cls] * w / total);
        r.setAttribute("x", at);
        r.setAttribute("width", Math.max(pw, 0));
        at += pw;
      }
      const label = bar.querySelector(".bar-label");
      if (label) {
        label.textContent = processed + "/" + total + " items: " + d.succeeded + " succeeded, " + d.failed + " failed, " +
          d.skipped + " filtered" + (bar.dataset.distributed === "true" ? " · on workers" : "");
      }
      return true;
    }

    function addLine(ev) {
      const ol = live.querySelector("ol.timeline");
      if (!ol) return;
      const li = document.createElement("li");
      li.className = "ev ev-" + ev.type;
      const span = (cls, text) => { const s = document.createElement("span"); s.className = cls; s.textContent = text; return s; };
      li.append(span("t", new Date(ev.time).toISOString().replace("T", " ")), " ", span("type", ev.type));
      if (ev.step) li.append(" ", span("step", ev.step));
      if (ev.attempt > 1) li.append(" (attempt " + ev.attempt + ")");
      if (ev.message) li.append(": " + ev.message);
      ol.prepend(li);
      // A page asked for the whole timeline keeps it whole.
      while (live.dataset.all !== "true" && ol.children.length > timelineMax) ol.lastElementChild.remove();
    }

    function apply(msg) {
      let ev;
      try { ev = JSON.parse(msg.data); } catch (e) { return; }
      const m = meta();
      if (m && ev.seq <= +m.dataset.seq) return; // already on the page
      if (m) m.dataset.seq = ev.seq;
      const st = stepStatus[ev.type];
      const node = ev.step ? nodeOf(ev.step) : null;
      if (st && node) {
        for (const c of Array.from(node.classList)) if (c.startsWith("st-")) node.classList.remove(c);
        node.classList.add("st-" + st);
        // The step's name for a screen reader: "name: status · what it is".
        const label = node.getAttribute("aria-label") || "", rest = label.indexOf(" · ");
        node.setAttribute("aria-label", ev.step.split("/").pop() + ": " + st.replace("-", " ") + (rest < 0 ? "" : label.slice(rest)));
      }
      const barMissing = ev.type === "step_progress" && ev.data && !setBar(ev.step, ev.data);
      addLine(ev);
      panelFollows(ev);
      if (barMissing || runEnds.includes(ev.type)) refresh();
    }

    function startPolling() {
      if (poller) return;
      setBadge("polling");
      poller = setInterval(refresh, pollEvery);
      retry = setTimeout(() => { retry = null; connect(); }, 10000); // the stream, again
    }

    function connect() {
      if (ended()) { stop(); return; }
      if (source) source.close();
      source = new EventSource(live.dataset.stream);
      source.onopen = () => {
        brokenSince = 0;
        clearInterval(poller);
        poller = null;
        setBadge("live");
        // The page was rendered just before the first opening; after a
        // break, what happened meanwhile is rendered again.
        if (opened) refresh();
        opened = true;
      };
      source.onmessage = apply;
      for (const t of Object.keys(stepStatus).concat(runEnds, ["run_started", "run_resumed", "run_replayed", "step_progress",
        "dead_lettered", "note", "split_fanout_started", "split_items_enqueued", "split_fanin_completed", "run_queued", "run_dequeued"])) {
        source.addEventListener(t, apply);
      }
      source.onerror = () => {
        if (ended()) { stop(); return; }
        if (!brokenSince) brokenSince = Date.now();
        if (source.readyState === EventSource.CLOSED || Date.now() - brokenSince > 3000) {
          source.close();
          source = null;
          startPolling();
        } else {
          setBadge("reconnecting");
        }
      };
    }

    // "Jump to the running step" leads to the step running now, which
    // may have changed since the page was drawn, and gives it the focus.
    function runningNode() {
      let found = null;
      for (const n of live.querySelectorAll("a.node.st-running, a.node.st-pending")) {
        if (!found) found = n;
        else if (n.dataset.key.startsWith(found.dataset.key + "/")) found = n; // a group's running sub-step
        else break;
      }
      return found;
    }
    live.addEventListener("click", (e) => {
      const jump = e.target.closest("#jump-running");
      if (!jump) return;
      const node = runningNode() || document.getElementById(decodeURIComponent(jump.hash.slice(1)));
      if (!node) return;
      e.preventDefault();
      node.focus({ preventScroll: true });
      node.scrollIntoView({ block: "center" });
    });

    // A step's panel opens beside the graph, and follows the step. Opened
    // from the keyboard or not, the focus goes to it, and back to the step
    // when it closes (its button or Escape).
    const panel = document.getElementById("panel");
    function closePanel() {
      panel.hidden = true;
      const node = nodeOf(panel.dataset.key);
      panel.dataset.key = "";
      if (node) node.focus();
    }
    async function showPanel(href, key, focus) {
      const resp = await fetch(href + "?fragment=1", { credentials: "same-origin" });
      if (!resp.ok) return;
      panel.innerHTML = await resp.text();
      const close = document.createElement("button");
      close.className = "close";
      close.textContent = "close";
      close.onclick = closePanel;
      panel.prepend(close);
      panel.dataset.key = key;
      panel.dataset.href = href;
      panel.hidden = false;
      if (focus) close.focus();
    }
    if (panel) {
      panel.addEventListener("keydown", (e) => { if (e.key === "Escape") closePanel(); });
      live.addEventListener("click", (e) => {
        const a = e.target.closest("a.node");
        if (!a || e.ctrlKey || e.metaKey || e.shiftKey) return;
        e.preventDefault();
        showPanel(a.getAttribute("href"), a.dataset.key, true);
      });
      panelFollows = (ev) => {
        if (!panel.hidden && ev.step && (ev.step === panel.dataset.key || ev.step.startsWith(panel.dataset.key + "/"))) {
          showPanel(panel.dataset.href, panel.dataset.key);
        }
      };
    }

    if (ended()) { setBadge("ended"); return; }
    connect();
  }

  // redraw swaps el's content for url's, keeping what a person has typed
  // in its fields (an approval's comment, say) and the field they type in.
  async function redraw(el, url) {
    const fieldKey = (f) => (f.form ? f.form.getAttribute("action") : "") + " " + f.name;
    const fields = () => el.querySelectorAll("input[type=text], textarea");
    const typed = new Map();
    for (const f of fields()) if (f.value) typed.set(fieldKey(f), f.value);
    const active = el.contains(document.activeElement) ? document.activeElement : null;
    const focused = active && active.name ? fieldKey(active) : null;
    const at = focused !== null && typed.has(focused) ? [active.selectionStart, active.selectionEnd] : null;
    await swap(el, url);
    for (const f of fields()) {
      const k = fieldKey(f);
      if (typed.has(k)) f.value = typed.get(k);
      if (k === focused) {
        f.focus();
        if (at) f.setSelectionRange(at[0], at[1]);
      }
    }
  }

  // followList keeps the runs list, the Now page or the approvals current:
  // it renders it again when a run starts or ends on any gateway, as the
  // stream of every run's status says, at most once in data-pace ms; every
  // few seconds while that stream is broken; and every 30 s in case a
  // change was lost without a resync, or came from no run (a delivery
  // parked).
  function followList(el) {
    let pending = false, source = null;
    const pace = +el.dataset.pace || 500;
    const refresh = () => {
      if (pending) return;
      pending = true;
      setTimeout(() => { pending = false; redraw(el, el.dataset.live).catch(() => {}); }, pace);
    };
    setInterval(() => { if (!source || source.readyState !== EventSource.OPEN) refresh(); }, 3000);
    setInterval(refresh, 30000);
    if (el.dataset.stream) {
      source = new EventSource(el.dataset.stream);
      source.onmessage = refresh;
      for (const t of ["resync"].concat(runEnds, ["run_started", "run_resumed", "run_replayed", "run_waiting", "run_queued", "run_dequeued"])) source.addEventListener(t, refresh);
    }
  }

  // tick moves on how long running runs have run, each from the time it
  // had when the server drew it.
  const firstSeen = new WeakMap();
  function tick() {
    const now = performance.now();
    for (const el of document.querySelectorAll(".took[data-ms]")) {
      if (!firstSeen.has(el)) firstSeen.set(el, now);
      el.textContent = duration(+el.dataset.ms + now - firstSeen.get(el));
    }
  }

  // duration writes ms as the server does, to the second: 1h2m3s.
  function duration(ms) {
    let s = Math.round(ms / 1000);
    const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60);
    s %= 60;
    return (h ? h + "h" : "") + (h || m ? m + "m" : "") + s + "s";
  }

  document.addEventListener("DOMContentLoaded", () => {
    const live = document.getElementById("live");
    if (live && live.dataset.stream) followRun(live);
    for (const id of ["runs", "now", "questions"]) {
      const el = document.getElementById(id);
      if (el && el.dataset.live) followList(el);
    }
    setInterval(tick, 1000);
  });
})();
