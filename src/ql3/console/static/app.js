"use strict";
// Minimal console: lists tasks and runs and starts runs. Text goes in via textContent only.
(function () {
  const $ = (id) => document.getElementById(id);
  const store = window.sessionStorage;
  let nextCursor = null;
  const taskNames = new Map();

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
      body.appendChild(row);
    }
    nextCursor = page.next_cursor;
    $("more").hidden = !nextCursor;
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
  }

  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if ($("token").value) store.setItem("ql3.token", $("token").value);
    $("token").value = "";
    refresh();
  });
  $("logout").addEventListener("click", () => { store.removeItem("ql3.token"); });
  $("more").addEventListener("click", () => loadRuns(true).catch((e) => { $("status").textContent = e.message; }));
  if (store.getItem("ql3.token")) refresh();
})();
