"use strict";
// ql3 console: tasks, runs (with a live log and cancel), approvals, workers and the cancellation card.
// Every value from the API reaches the page through textContent or a form value, never as markup.
(function () {
  const $ = (id) => document.getElementById(id);
  const store = window.sessionStorage;
  const TOKEN_KEY = "ql3.token";
  const PROJECT_KEY = "ql3.project";
  const TERMINAL = new Set(["succeeded", "failed", "cancelled", "timed_out"]);
  const REASON_RE = /^[a-z][a-z0-9_]{0,63}$/;
  const LOG_PAGE = 65536;
  const MAX_LOG_CHARS = 1048576; // the log view keeps the last 1 MiB of text
  const REFRESH_MS = 5000;
  const taskNames = new Map();
  let runsCursor = null; // next_cursor of the runs list
  let runsExtended = false; // older runs were loaded: the periodic refresh leaves the list alone
  let blockedCursor = null;
  let currentRun = null; // the run shown in the detail view
  let follow = null; // { runId, attempt, offset, timer, stopped }

  class ApiError extends Error {
    constructor(code, message) {
      super(code + ": " + message);
      this.code = code;
    }
  }

  // --- plumbing -------------------------------------------------------------------------------------

  // A token in the fragment (#token=...) is read once, kept in sessionStorage and removed from the URL.
  function takeFragmentToken() {
    if (!window.location.hash.startsWith("#")) return;
    const params = new URLSearchParams(window.location.hash.slice(1));
    if (!params.has("token")) return false;
    const token = params.get("token");
    if (token) store.setItem(TOKEN_KEY, token);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    return true;
  }

  function project() { return store.getItem(PROJECT_KEY) || "default"; }
  function projectPath(rest) { return "/projects/" + encodeURIComponent(project()) + rest; }
  function runPath(runId, rest) { return projectPath("/runs/" + encodeURIComponent(runId) + (rest || "")); }

  async function api(method, path, body) {
    const headers = { "Authorization": "Bearer " + (store.getItem(TOKEN_KEY) || "") };
    const init = { method: method, headers: headers, cache: "no-store" };
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body || {});
    }
    let resp;
    try {
      resp = await fetch("/api/v1" + path, init);
    } catch (e) {
      throw new ApiError("network_error", "the server did not answer");
    }
    let data = null;
    if (resp.status !== 204) {
      try { data = await resp.json(); } catch (e) { data = null; }
    }
    if (!resp.ok) {
      const err = data && data.error;
      if (err && err.code) throw new ApiError(String(err.code), String(err.message || ""));
      throw new ApiError("http_" + resp.status, resp.statusText || "request failed");
    }
    return { status: resp.status, body: data };
  }

  async function get(path) { return (await api("GET", path)).body; }

  // The status line: what the user's last action did, or why the last refresh failed.
  function say(text, isError, fromRefresh) {
    const line = $("status");
    line.textContent = text;
    line.classList.toggle("error", Boolean(isError));
    line.dataset.source = fromRefresh ? "refresh" : "action";
    if (isError && text.startsWith("unauthenticated")) $("token").focus();
  }

  function fail(e) { say(e instanceof ApiError ? e.message : "client_error: " + e.message, true); }

  function text(value) { return value === null || value === undefined ? "" : String(value); }

  function when(ms) {
    return typeof ms === "number" && ms > 0 ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "";
  }

  function cell(row, value, className) {
    const td = document.createElement("td");
    td.textContent = text(value);
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  // A status as text; the class only adds a colour to words that already say everything.
  function badge(value) {
    const span = document.createElement("span");
    span.className = "badge badge-" + text(value).replace(/[^a-z_]/g, "");
    span.textContent = text(value);
    return span;
  }

  function button(label, onClick, ariaLabel, className) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    if (ariaLabel) b.setAttribute("aria-label", ariaLabel);
    if (className) b.className = className;
    b.addEventListener("click", onClick);
    return b;
  }

  function fill(tbody, rows, columns, emptyText) {
    if (rows.length === 0) {
      const row = document.createElement("tr");
      const td = cell(row, emptyText, "empty");
      td.colSpan = columns;
      rows = [row];
    }
    tbody.replaceChildren(...rows);
  }

  function pairs(list, entries) {
    list.replaceChildren();
    for (const [key, value] of entries) {
      if (value === null || value === undefined || value === "") continue;
      const dt = document.createElement("dt");
      dt.textContent = key;
      const dd = document.createElement("dd");
      dd.textContent = text(value);
      list.append(dt, dd);
    }
  }

  function taskName(id) { return taskNames.get(id) || id; }

  // --- projects and tasks ---------------------------------------------------------------------------

  async function loadProjects() {
    const page = await get("/projects?limit=200");
    const names = page.items.map((p) => String(p.name));
    if (names.length && !names.includes(project())) {
      store.setItem(PROJECT_KEY, names.includes("default") ? "default" : names[0]);
    }
    if (!names.includes(project())) names.unshift(project());
    const select = $("project");
    select.replaceChildren(...names.map((name) => {
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name;
      return option;
    }));
    select.value = project();
  }

  async function loadTasks() {
    const page = await get(projectPath("/tasks?limit=200"));
    taskNames.clear();
    const withNext = page.items.some((t) => typeof t.next_fire_at_ms === "number");
    $("th-next").hidden = !withNext;
    const rows = page.items.map((t) => {
      taskNames.set(t.id, t.name);
      const row = document.createElement("tr");
      cell(row, t.name);
      cell(row, t.revision, "num");
      cell(row, t.enabled ? "yes" : "no");
      cell(row, t.cron || "", "mono");
      if (withNext) cell(row, when(t.next_fire_at_ms), "time");
      cell(row, t.approval === "required" ? "required" : "");
      cell(row, "").appendChild(button("Run", () => startRun(t), "Run task " + t.name));
      return row;
    });
    fill($("tasks"), rows, withNext ? 7 : 6, "No tasks yet (ql3 task add NAME --command CMD).");
  }

  async function startRun(task) {
    try {
      const res = await api("POST", projectPath("/tasks/" + encodeURIComponent(task.id) + "/runs"));
      if (res.status === 202) {
        say("Approval request " + res.body.approval.id + " created for " + task.name +
          "; the run starts once another user approves it.");
        await loadApprovals();
      } else {
        say("Run " + res.body.id + " of " + task.name + " queued.");
        await loadRuns(false);
        openRun(res.body.id);
      }
    } catch (e) { fail(e); }
  }

  // --- runs and the run detail ----------------------------------------------------------------------

  async function loadRuns(append) {
    const query = "?limit=50" + (append && runsCursor ? "&cursor=" + encodeURIComponent(runsCursor) : "");
    const page = await get(projectPath("/runs" + query));
    const rows = page.items.map((r) => {
      const row = document.createElement("tr");
      if (currentRun && currentRun.id === r.id) row.className = "selected";
      cell(row, "").appendChild(button(r.id, () => openRun(r.id), "Show run " + r.id, "link mono"));
      cell(row, "").appendChild(badge(r.status));
      cell(row, taskName(r.task_id));
      cell(row, when(r.created_at_ms), "time");
      cell(row, r.exit_code, "num");
      return row;
    });
    if (append) $("runs").append(...rows);
    else fill($("runs"), rows, 5, "No runs yet.");
    runsExtended = Boolean(append);
    runsCursor = page.next_cursor;
    $("more").hidden = !runsCursor;
  }

  function showRun(run) {
    currentRun = run;
    $("detail-id").textContent = run.id;
    pairs($("detail-fields"), [
      ["status", run.status],
      ["task", taskName(run.task_id) + " (revision " + run.task_revision + ")"],
      ["trigger", run.trigger_type],
      ["created", when(run.created_at_ms)],
      ["started", when(run.started_at_ms)],
      ["finished", when(run.finished_at_ms)],
      ["exit code", run.exit_code],
      ["error code", run.error_code],
      ["cancel requested", when(run.cancel_requested_at_ms)],
      ["cancel reason", run.cancel_reason],
    ]);
    $("detail-cancel").hidden = TERMINAL.has(run.status);
  }

  async function showCancellation(runId) {
    if (!currentRun || currentRun.id !== runId || !currentRun.cancel_requested_at_ms) return;
    const facts = await get(runPath(runId, "/cancellation"));
    if (!currentRun || currentRun.id !== runId) return;
    const list = $("detail-fields");
    const d = facts.dispatch;
    const add = (key, value) => {
      const dt = document.createElement("dt");
      dt.textContent = key;
      const dd = document.createElement("dd");
      dd.textContent = value;
      list.append(dt, dd);
    };
    if (d) add("cancel dispatch", d.status + (d.lastResult ? " (last result " + d.lastResult + ")" : ""));
    if (facts.operatorAction !== "none") add("operator action", facts.operatorAction);
  }

  function appendLog(chunk) {
    if (!chunk) return;
    const pre = $("detail-log");
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    let all = pre.textContent + chunk;
    if (all.length > MAX_LOG_CHARS) all = all.slice(all.length - MAX_LOG_CHARS);
    pre.textContent = all;
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function logQuery(offset, attempt) {
    return "/logs?offset=" + offset + "&max_bytes=" + LOG_PAGE + (attempt ? "&attempt=" + attempt : "");
  }

  function stopFollowing() {
    if (follow) {
      follow.stopped = true;
      if (follow.timer) clearTimeout(follow.timer);
    }
    follow = null;
  }

  // Like `ql3 run logs --follow`: read the latest attempt from the last offset; when a retry starts,
  // drain the old attempt's log first; stop once the run is terminal and its log is complete.
  async function pollLog(state, delay) {
    if (state.stopped) return;
    let next = delay;
    try {
      const page = await get(runPath(state.runId, logQuery(state.offset, null)));
      if (state.stopped) return;
      if (state.attempt && page.attempt && page.attempt !== state.attempt) {
        for (let i = 0; i < 64; i++) {
          const rest = await get(runPath(state.runId, logQuery(state.offset, state.attempt)));
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
          const run = await get(runPath(state.runId));
          if (state.stopped) return;
          showRun(run);
          await showCancellation(run.id);
          $("detail-follow").textContent = "The run has ended.";
          refreshRuns();
          return;
        }
        if (!page.eof) {
          next = 0;
        } else if (moved) {
          next = 250;
        } else {
          next = Math.min(2000, Math.max(250, delay * 2));
          const run = await get(runPath(state.runId));
          if (state.stopped) return;
          showRun(run);
          await showCancellation(run.id);
        }
      }
      $("detail-follow").textContent = "Following the log\u2026";
    } catch (e) {
      if (state.stopped) return;
      $("detail-follow").textContent = e.message;
      if (e.code === "logs_unavailable" || e.code === "not_found") return;
      next = Math.min(5000, Math.max(1000, delay * 2));
    }
    if (!state.stopped) state.timer = setTimeout(() => pollLog(state, next), next);
  }

  async function openRun(runId) {
    stopFollowing();
    currentRun = null;
    $("detail").hidden = false;
    $("detail-id").textContent = runId;
    $("detail-fields").replaceChildren();
    $("detail-cancel").hidden = true;
    $("detail-log").textContent = "";
    $("detail-follow").textContent = "Following the log\u2026";
    for (const row of $("runs").children) row.classList.remove("selected");
    try {
      showRun(await get(runPath(runId)));
      await showCancellation(runId);
      follow = { runId: runId, attempt: null, offset: 0, timer: null, stopped: false };
      pollLog(follow, 250);
      $("detail").scrollIntoView({ block: "nearest" });
    } catch (e) {
      $("detail-follow").textContent = e.message;
    }
  }

  async function cancelRun() {
    if (!currentRun) return;
    const runId = currentRun.id;
    const words = {
      requested: "Cancel requested for run ",
      already_requested: "A cancel was already requested for run ",
      already_terminal: "Nothing to cancel: already ended: run ",
    };
    try {
      const res = await api("POST", runPath(runId, "/cancel"));
      say((words[res.body.result] || "Cancel: ") + runId + ".");
      if (currentRun && currentRun.id === runId) {
        showRun(res.body.run);
        await showCancellation(runId);
      }
      refreshRuns();
      loadSummary().catch(fail);
    } catch (e) { fail(e); }
  }

  function refreshRuns() {
    if (!runsExtended && !$("runs").contains(document.activeElement)) loadRuns(false).catch(fail);
  }

  // --- approvals ------------------------------------------------------------------------------------

  async function loadApprovals() {
    const pending = (await get(projectPath("/approvals?state=pending&limit=100"))).items;
    const recent = (await get(projectPath("/approvals?limit=50"))).items;
    const open = pending.filter((a) => a.effective_state === "pending");
    const seen = new Set(open.map((a) => a.id));
    const list = open.concat(recent.filter((a) => !seen.has(a.id)));
    const rows = list.map((a) => {
      const row = document.createElement("tr");
      cell(row, a.id, "mono");
      cell(row, "").appendChild(badge(a.effective_state));
      cell(row, a.action_type === "run.create" ? taskName(a.action_ref) : a.action_type + " " + a.action_ref);
      cell(row, when(a.requested_at_ms), "time");
      cell(row, when(a.expires_at_ms), "time");
      cell(row, a.decision ? a.reason_code : "", "mono");
      const actions = cell(row, "", "actions");
      if (a.effective_state === "pending") {
        const reason = document.createElement("input");
        reason.type = "text";
        reason.size = 11;
        reason.placeholder = "reason_code";
        reason.setAttribute("aria-label", "Reason code for rejecting " + a.id);
        actions.append(
          button("Approve", () => decide(a.id, "approve", "approved"), "Approve " + a.id),
          reason,
          button("Reject", () => decide(a.id, "reject", reason.value.trim()), "Reject " + a.id),
        );
      }
      return row;
    });
    fill($("approvals"), rows, 7, "No approval requests.");
  }

  async function decide(approvalId, decision, reasonCode) {
    if (!REASON_RE.test(reasonCode)) {
      say("validation_failed: a reason code is lower-case letters, digits and _ (e.g. not_needed)", true);
      return;
    }
    try {
      const res = await api("POST", projectPath("/approvals/" + encodeURIComponent(approvalId) + "/" + decision),
        { reason_code: reasonCode });
      say("Approval " + approvalId + ": " + res.body.state + ".");
      await loadApprovals();
      refreshRuns();
    } catch (e) { fail(e); }
  }

  // --- workers --------------------------------------------------------------------------------------

  async function loadWorkers() {
    const page = await get(projectPath("/workers"));
    const rows = page.items.map((w) => {
      const row = document.createElement("tr");
      cell(row, w.id, "mono");
      cell(row, "").appendChild(badge(w.status));
      cell(row, w.active_runs, "num");
      cell(row, w.max_concurrent_runs, "num");
      cell(row, Object.entries(w.labels || {}).map(([k, v]) => k + "=" + v).join(", "));
      cell(row, (w.executors || []).join(", "));
      cell(row, when(w.last_heartbeat_at_ms), "time");
      return row;
    });
    fill($("workers"), rows, 7, "No workers registered.");
  }

  // --- the cancellation status card -----------------------------------------------------------------

  const ADVICE = {
    none: "Nothing to do.",
    wait: "Cancellations are in progress; they converge on their own.",
    inspect: "Some cancellations are blocked: list them and inspect each (ql3 run inspect RUN).",
  };

  async function loadSummary() {
    const s = await get(projectPath("/cancellation/summary"));
    const assessment = $("card-assessment");
    assessment.textContent = s.assessment;
    assessment.className = "badge badge-" + String(s.assessment).replace(/[^a-z_]/g, "");
    $("card-advice").textContent = ADVICE[s.operatorAction] || "";
    const d = s.dispatches;
    pairs($("card-dispatches"), [
      ["pending", d.pending], ["leased", d.leased], ["retry wait", d.retryWait],
      ["dispatched", d.dispatched], ["blocked", d.blocked], ["total", d.total],
    ]);
    const b = s.blockingResults;
    pairs($("card-blocking"), [
      ["identity mismatch", b.identityMismatch], ["pid mismatch", b.pidMismatch],
      ["unsupported", b.unsupported], ["invalid", b.invalid],
    ]);
    pairs($("card-signals"), [["due", s.signals.due], ["expired lease", s.signals.expiredLease]]);
    $("card-oldest").textContent = s.oldestBlockedAtMs ? "Oldest blocked since " + when(s.oldestBlockedAtMs) + " UTC." : "";
    $("blocked-show").textContent = "List blocked runs (" + d.blocked + ")";
  }

  async function loadBlocked(next) {
    const query = next && blockedCursor ? "?cursor=" + encodeURIComponent(blockedCursor) : "";
    const page = await get(projectPath("/cancellation/blocked" + query));
    const rows = page.items.map((item) => {
      const row = document.createElement("tr");
      cell(row, "").appendChild(button(item.runId, () => openRun(item.runId), "Show run " + item.runId, "link mono"));
      cell(row, when(item.blockedAtMs), "time");
      return row;
    });
    fill($("blocked-rows"), rows, 2, "No blocked cancellations.");
    blockedCursor = page.nextCursor;
    $("blocked").hidden = false;
    $("blocked-more").hidden = !blockedCursor;
    $("blocked-note").textContent = "As of " + when(page.snapshotAtMs) + " UTC" +
      (page.truncated ? "; more blocked runs follow on the next page." : ".");
  }

  // --- refresh --------------------------------------------------------------------------------------

  // Each part loads on its own, so a missing permission (say worker.read) hides only that part; a part
  // the user is working in (focus inside it) is not redrawn under their hands.
  async function refresh(quiet) {
    $("content").hidden = !store.getItem(TOKEN_KEY);
    if (!store.getItem(TOKEN_KEY)) {
      say("Enter a bearer token (ql3 token create --role viewer) and press Connect.", false);
      $("token").focus();
      return;
    }
    const errors = [];
    const part = async (tbodyId, load) => {
      if (quiet && $(tbodyId).contains(document.activeElement)) return;
      try {
        await load();
      } catch (e) {
        errors.push(e instanceof ApiError ? e.message : "client_error: " + e.message);
        if ($(tbodyId).tagName === "TBODY") $(tbodyId).replaceChildren(); // no stale rows of another token
      }
    };
    if (!quiet) await part("project", loadProjects);
    await part("tasks", loadTasks);
    await part("card", loadSummary);
    if (!(quiet && runsExtended)) await part("runs", () => loadRuns(false));
    await part("approvals", loadApprovals);
    await part("workers", loadWorkers);
    if (errors.length) say([...new Set(errors)].join(" \u00b7 "), true, true);
    else if (!quiet || $("status").dataset.source === "refresh") say("", false, true);
  }

  function tick() {
    if (!document.hidden && store.getItem(TOKEN_KEY)) refresh(true);
  }

  // --- wiring ---------------------------------------------------------------------------------------

  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if ($("token").value) store.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    refresh(false);
  });
  $("project").addEventListener("change", () => {
    store.setItem(PROJECT_KEY, $("project").value);
    stopFollowing();
    currentRun = null;
    $("detail").hidden = true;
    $("blocked").hidden = true;
    refresh(false);
  });
  $("refresh").addEventListener("click", () => refresh(false));
  $("logout").addEventListener("click", () => {
    store.removeItem(TOKEN_KEY);
    stopFollowing();
    currentRun = null;
    $("detail").hidden = true;
    $("blocked").hidden = true;
    for (const id of ["tasks", "runs", "approvals", "workers"]) $(id).replaceChildren();
    $("content").hidden = true;
    say("Token forgotten.", false);
  });
  $("detail-close").addEventListener("click", () => {
    stopFollowing();
    currentRun = null;
    $("detail").hidden = true;
  });
  $("detail-cancel").addEventListener("click", cancelRun);
  $("more").addEventListener("click", () => loadRuns(true).catch(fail));
  $("blocked-show").addEventListener("click", () => { blockedCursor = null; loadBlocked(false).catch(fail); });
  $("blocked-more").addEventListener("click", () => loadBlocked(true).catch(fail));

  window.addEventListener("hashchange", () => { if (takeFragmentToken()) refresh(false); });
  takeFragmentToken();
  refresh(false);
  setInterval(tick, REFRESH_MS);
})();
