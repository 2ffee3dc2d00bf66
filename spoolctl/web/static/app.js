// spoolctl web: local times with ages, live fragments, live output and events.
// Everything a job controls arrives escaped by the server (HTML fragments) or
// is inserted as text (output chunks): nothing here builds markup from data.
"use strict";

(function () {
  let skew = 0; // server clock minus this browser's clock, in seconds

  function readServerNow(el) {
    const now = parseFloat(el && el.dataset ? el.dataset.now : "");
    if (!Number.isNaN(now)) skew = now - Date.now() / 1000;
  }

  const pad = (n) => String(n).padStart(2, "0");

  function localText(date) {
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
      `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  function age(seconds) {
    const a = Math.abs(seconds);
    let text;
    if (a < 2) return "just now";
    if (a < 90) text = `${Math.round(a)} s`;
    else if (a < 5400) text = `${Math.round(a / 60)} min`;
    else if (a < 172800) text = `${Math.round(a / 3600)} h`;
    else text = `${Math.round(a / 86400)} d`;
    return seconds >= 0 ? `${text} ago` : `in ${text}`;
  }

  function formatTimes(root) {
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
    for (const el of root.querySelectorAll("time.ts[data-ts]")) {
      const ts = parseFloat(el.dataset.ts);
      if (Number.isNaN(ts)) continue;
      const date = new Date(ts * 1000);
      el.textContent = `${localText(date)} (${age(Date.now() / 1000 + skew - ts)})`;
      el.title = `${el.getAttribute("datetime")} · shown in ${zone}`;
    }
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function getJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    return response.json();
  }

  function typing(el) {
    const active = document.activeElement;
    return active && el.contains(active) && active.matches("input, select, textarea");
  }

  // A region re-rendered by the server every few seconds (overview, a job's facts).
  async function liveRegion(el) {
    const every = parseInt(el.dataset.liveInterval, 10) || 2000;
    for (;;) {
      await sleep(every);
      if (typing(el)) continue;
      try {
        const response = await fetch(el.dataset.liveSrc, { credentials: "same-origin" });
        if (!response.ok) continue;
        el.innerHTML = await response.text();
        const root = el.querySelector(".live-root");
        readServerNow(root);
        formatTimes(el);
        el.dataset.refreshed = String(Date.now());
        if (root && root.dataset.terminal === "yes") return;
      } catch (err) {
        // the server may be restarting: try again at the next tick
      }
    }
  }

  function appendText(pre, text) {
    if (!text) return;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(document.createTextNode(text));
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  // The chosen (or latest) attempt's stdout and stderr, followed while it runs.
  async function followOutput(section) {
    const job = section.dataset.job;
    const pinned = section.dataset.pinned === "yes";
    let attempt = section.dataset.attempt;
    const names = ["stdout", "stderr"];
    const pres = {};
    const offsets = {};
    for (const name of names) {
      pres[name] = section.querySelector(`pre[data-stream="${name}"]`);
      offsets[name] = parseInt(pres[name].dataset.offset, 10) || 0;
      pres[name].scrollTop = pres[name].scrollHeight; // the end of the output first
    }
    const label = section.querySelector("#attempt-label");
    const state = section.querySelector("#follow-state");
    for (;;) {
      let running = false;
      let terminal = false;
      try {
        for (let i = 0; i < names.length; i++) {
          const name = names[i];
          const which = pinned ? `&attempt=${encodeURIComponent(attempt)}` : "";
          const d = await getJSON(`/jobs/${job}/output?stream=${name}&offset=${offsets[name]}${which}`);
          if (!pinned && d.attempt_no !== null && String(d.attempt_no) !== String(attempt)) {
            attempt = String(d.attempt_no); // a new attempt: show it from its start
            for (const n of names) { pres[n].textContent = ""; offsets[n] = 0; }
            const empty = section.querySelector("#no-output");
            if (empty) empty.remove();
            i = -1;
            continue;
          }
          if (label && d.attempt_no !== null) label.textContent = `attempt ${d.attempt_no} (${d.attempt_state})`;
          appendText(pres[name], d.text);
          offsets[name] = d.offset;
          if (d.more) { i--; continue; }
          running = d.running;
          terminal = d.job_terminal;
        }
      } catch (err) {
        if (state) state.textContent = "output unavailable, retrying";
        await sleep(2000);
        continue;
      }
      if (state) state.textContent = running ? "● following" : "";
      section.dataset.following = running ? "yes" : "no";
      if (!running && (terminal || pinned)) return;
      await sleep(running ? 500 : 1500);
    }
  }

  // New ledger events, newest on top, read after a cursor like `events --follow`.
  async function liveEvents(tbody) {
    const base = tbody.dataset.eventsLive;
    const job = tbody.dataset.job ? `&job=${encodeURIComponent(tbody.dataset.job)}` : "";
    for (;;) {
      await sleep(1000);
      try {
        const d = await getJSON(`${base}?cursor=${encodeURIComponent(tbody.dataset.cursor)}${job}`);
        if (d.count > 0) {
          tbody.insertAdjacentHTML("afterbegin", d.html); // server-rendered, escaped rows
          formatTimes(tbody);
          const empty = document.getElementById("no-events");
          if (empty) empty.remove();
          while (tbody.rows.length > 1000) tbody.deleteRow(-1);
        }
        tbody.dataset.cursor = String(d.cursor);
      } catch (err) {
        // try again at the next tick
      }
    }
  }

  function start() {
    readServerNow(document.body);
    formatTimes(document);
    setInterval(() => formatTimes(document), 5000);
    for (const el of document.querySelectorAll("[data-live-src]")) liveRegion(el);
    const output = document.getElementById("output");
    if (output) followOutput(output);
    const events = document.querySelector("tbody[data-events-live]");
    if (events) liveEvents(events);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
