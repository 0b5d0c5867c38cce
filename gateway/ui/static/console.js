// The console's script: it follows a run live and keeps the runs list
// fresh. Pages work without it; it only spares the reloads.
"use strict";

(function () {
  const pollEvery = 2000;

  // swap replaces el's content with the HTML at url, when it answers.
  async function swap(el, url) {
    const resp = await fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } });
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    el.innerHTML = await resp.text();
  }

  // followRun keeps the run page's live part current: it refreshes on
  // every event from the run's stream, and by polling while the stream is
  // broken. The badge says which.
  function followRun(live) {
    const badge = document.getElementById("badge");
    const setBadge = (state, text) => { badge.dataset.state = state; badge.textContent = text; };
    let source = null, poller = null, pending = false, brokenSince = 0, retry = null;
    const ended = () => live.querySelector(".run-meta[data-final='true']") !== null;

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
      if (poller) clearInterval(poller);
      if (retry) clearTimeout(retry);
      source = poller = retry = null;
      setBadge("ended", "ended");
    }
    function startPolling() {
      if (poller) return;
      setBadge("polling", "polling");
      poller = setInterval(refresh, pollEvery);
      // Try the stream again now and then.
      retry = setTimeout(() => { retry = null; connect(); }, 10000);
    }
    function connect() {
      if (ended()) { stop(); return; }
      if (source) source.close();
      source = new EventSource(live.dataset.stream);
      source.onopen = () => {
        brokenSince = 0;
        if (poller) { clearInterval(poller); poller = null; }
        setBadge("live", "live");
        refresh();
      };
      source.onmessage = refresh;
      for (const t of ["run_started", "run_resumed", "run_replayed", "run_succeeded", "run_failed", "run_cancelled", "run_timed_out",
        "step_started", "step_succeeded", "step_failed", "step_skipped", "step_retrying", "step_timed_out", "step_cancelled",
        "step_progress", "dead_lettered", "split_fanout_started", "split_items_enqueued", "split_fanin_completed"]) {
        source.addEventListener(t, refresh);
      }
      source.onerror = () => {
        if (ended()) { stop(); return; }
        if (!brokenSince) brokenSince = Date.now();
        if (source.readyState === EventSource.CLOSED || Date.now() - brokenSince > 3000) {
          source.close();
          source = null;
          startPolling();
        } else {
          setBadge("reconnecting", "reconnecting");
        }
      };
    }
    if (ended()) { setBadge("ended", "ended"); return; }
    connect();
  }

  // followList refreshes a list that asks to be kept live.
  function followList(el) {
    setInterval(() => { swap(el, el.dataset.live).catch(() => {}); }, 3000);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const live = document.getElementById("live");
    if (live && live.dataset.stream) followRun(live);
    const runs = document.getElementById("runs");
    if (runs && runs.dataset.live) followList(runs);
  });
})();
