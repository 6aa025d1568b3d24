"use strict";
// Minimal console: tasks, runs (with a detail view that tails the live log), workers.
// Text goes in via textContent only.
(function () {
  const $ = (id) => document.getElementById(id);
  const store = window.sessionStorage;
  let nextCursor = null;
  const taskNames = new Map();
  const TERMINAL = new Set(["succeeded", "failed", "cancelled", "timed_out"]);
  const LOG_PAGE = 65536;
  const MAX_LOG_CHARS = 1048576; // the view keeps the last 1 MiB of text
  let follow = null; // { runId, attempt, offset, timer, stopped }

  function project() { return encodeURIComponent($("project").value || "default"); }

  async function api(method, path) {
    const resp = await fetch("/api/v1" + path, {
      method: method,
      headers: { "Authorization": "Bearer " + (store.getItem("ql3.token") || ""), "Content-Type": "application/json" },
      body: method === "POST" ? "{}" : undefined,
    });
    const body = resp.status === 204 ? null : await resp.json();
    if (!resp.ok) {
      const err = (body && body.error) || { code: "http_" + resp.status, message: resp.statusText };
      throw new Error(err.code + ": " + err.message);
    }
    return body;
  }

  function cell(row, text, mono) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (mono) td.className = "mono";
    row.appendChild(td);
    return td;
  }

  function when(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : ""; }

  async function loadTasks() {
    const page = await api("GET", "/projects/" + project() + "/tasks?limit=200");
    const body = $("tasks");
    body.replaceChildren();
    taskNames.clear();
    for (const t of page.items) {
      taskNames.set(t.id, t.name);
      const row = document.createElement("tr");
      cell(row, t.name);
      cell(row, t.revision);
      cell(row, t.enabled ? "yes" : "no");
      cell(row, t.cron || "", true);
      const button = document.createElement("button");
      button.textContent = "Run";
      button.addEventListener("click", () => start(t.id));
      cell(row, "").appendChild(button);
      body.appendChild(row);
    }
  }

  async function loadRuns(append) {
    const query = "?limit=50" + (append && nextCursor ? "&cursor=" + encodeURIComponent(nextCursor) : "");
    const page = await api("GET", "/projects/" + project() + "/runs" + query);
    const body = $("runs");
    if (!append) body.replaceChildren();
    for (const r of page.items) {
      const row = document.createElement("tr");
      cell(row, r.id, true);
      cell(row, taskNames.get(r.task_id) || r.task_id);
      cell(row, r.status);
      cell(row, when(r.created_at_ms));
      cell(row, r.exit_code);
      row.title = "Show the run and its log";
      row.addEventListener("click", () => openRun(r.id));
      body.appendChild(row);
    }
    nextCursor = page.next_cursor;
    $("more").hidden = !nextCursor;
  }

  function stopFollowing() {
    if (follow) {
      follow.stopped = true;
      if (follow.timer) clearTimeout(follow.timer);
    }
    follow = null;
  }

  function showRun(run) {
    const list = $("detail-fields");
    list.replaceChildren();
    const pairs = [
      ["status", run.status],
      ["task", taskNames.get(run.task_id) || run.task_id],
      ["revision", run.task_revision],
      ["created", when(run.created_at_ms)],
      ["started", when(run.started_at_ms)],
      ["finished", when(run.finished_at_ms)],
      ["exit code", run.exit_code],
      ["error code", run.error_code],
    ];
    for (const [key, value] of pairs) {
      if (value === null || value === undefined || value === "") continue;
      const dt = document.createElement("dt");
      dt.textContent = key;
      const dd = document.createElement("dd");
      dd.textContent = String(value);
      list.append(dt, dd);
    }
  }

  function appendLog(text) {
    if (!text) return;
    const pre = $("detail-log");
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    let all = pre.textContent + text;
    if (all.length > MAX_LOG_CHARS) all = all.slice(all.length - MAX_LOG_CHARS);
    pre.textContent = all;
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function logQuery(offset, attempt) {
    return "/logs?offset=" + offset + "&max_bytes=" + LOG_PAGE + (attempt ? "&attempt=" + attempt : "");
  }

  // Like `ql3 run logs --follow`: ask for the latest attempt from the last offset; when a retry starts,
  // finish the old attempt's log first; stop once the run is terminal and its log is drained.
  async function pollLog(state, delay) {
    if (state.stopped) return;
    const base = "/projects/" + project() + "/runs/" + encodeURIComponent(state.runId);
    let next = delay;
    try {
      const page = await api("GET", base + logQuery(state.offset, null));
      if (state.stopped) return;
      if (state.attempt && page.attempt && page.attempt !== state.attempt) {
        for (let i = 0; i < 64; i++) {
          const rest = await api("GET", base + logQuery(state.offset, state.attempt));
          if (state.stopped) return;
          appendLog(rest.data);
          state.offset = rest.next_offset;
          if (rest.eof) break;
        }
        state.attempt = page.attempt;
        state.offset = 0;
        appendLog("\n[attempt " + page.attempt + "]\n");
        next = 0;
      } else {
        state.attempt = page.attempt;
        appendLog(page.data);
        const moved = page.next_offset !== state.offset;
        state.offset = page.next_offset;
        if (page.complete) {
          showRun(await api("GET", base));
          $("detail-follow").textContent = "The run has ended.";
          return;
        }
        if (!page.eof) {
          next = 0;
        } else if (moved) {
          next = 250;
        } else {
          next = Math.min(2000, Math.max(250, delay * 2));
          showRun(await api("GET", base));
        }
      }
    } catch (e) {
      $("detail-follow").textContent = e.message;
      if (e.message.startsWith("logs_unavailable") || e.message.startsWith("not_found")) return;
      next = Math.min(5000, Math.max(1000, delay * 2));
    }
    if (!state.stopped) state.timer = setTimeout(() => pollLog(state, next), next);
  }

  async function openRun(runId) {
    stopFollowing();
    $("detail").hidden = false;
    $("detail-id").textContent = runId;
    $("detail-log").textContent = "";
    $("detail-follow").textContent = "Following the log\u2026";
    try {
      showRun(await api("GET", "/projects/" + project() + "/runs/" + encodeURIComponent(runId)));
      follow = { runId: runId, attempt: null, offset: 0, timer: null, stopped: false };
      pollLog(follow, 250);
    } catch (e) { $("detail-follow").textContent = e.message; }
  }

  async function loadWorkers() {
    const page = await api("GET", "/projects/" + project() + "/workers");
    const body = $("workers");
    body.replaceChildren();
    for (const w of page.items) {
      const row = document.createElement("tr");
      cell(row, w.id, true);
      cell(row, w.status);
      cell(row, w.active_runs);
      cell(row, w.max_concurrent_runs);
      cell(row, Object.entries(w.labels || {}).map(([k, v]) => k + "=" + v).join(", "));
      cell(row, when(w.last_heartbeat_at_ms));
      body.appendChild(row);
    }
  }

  async function start(taskId) {
    try {
      await api("POST", "/projects/" + project() + "/tasks/" + encodeURIComponent(taskId) + "/runs");
      await loadRuns(false);
    } catch (e) { $("status").textContent = e.message; }
  }

  async function refresh() {
    $("status").textContent = "";
    try { await loadTasks(); await loadRuns(false); } catch (e) { $("status").textContent = e.message; }
    // Workers need worker.read; a failure there must not hide tasks and runs.
    try { await loadWorkers(); } catch (e) { $("workers").replaceChildren(); }
  }

  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if ($("token").value) store.setItem("ql3.token", $("token").value);
    $("token").value = "";
    refresh();
  });
  $("logout").addEventListener("click", () => { store.removeItem("ql3.token"); stopFollowing(); });
  $("detail-close").addEventListener("click", () => { stopFollowing(); $("detail").hidden = true; });
  $("more").addEventListener("click", () => loadRuns(true).catch((e) => { $("status").textContent = e.message; }));
  if (store.getItem("ql3.token")) refresh();
})();
