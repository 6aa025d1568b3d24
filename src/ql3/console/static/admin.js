"use strict";
// ql3 console, admin pages (#/admin/...): notification channels, rules, test sends and delivery history;
// retention; an online backup download; projects and their members. What the CLI does with
// `ql3 notify`, `ql3 project retention`, `ql3 db backup`, `ql3 project` and `ql3 token`, over the same
// /api/v1 calls. Loaded before app.js, which calls the setup below with its helpers (extensionApi).
// Like app.js, every API value reaches the page as text, an attribute or a form value, never as markup.
(window.ql3Extensions = window.ql3Extensions || []).push(function (api) {
  const { t, lbl, el, put, btn, badge, enc, table, fields, when, say, fail, can, go, pp, get, post, request,
    current, setRefresh, confirmAction, ApiError } = api;
  const EVENTS = ["failed", "timed_out", "lost", "cancellation_blocked", "approval_requested", "cron_late", "script",
    "succeeded"];
  const DEFAULT_EVENTS = new Set(["failed", "timed_out", "lost", "cancellation_blocked", "approval_requested",
    "cron_late", "script"]);
  const ROLES = ["viewer", "operator", "approver", "admin"];
  const HISTORY_PAGE = 20;
  const SECTIONS = ["notifications", "retention", "backup", "projects"];

  api.i18n({
    adm_title: "Admin", adm_notifications: "Notifications", adm_retention: "Retention", adm_backup: "Backup",
    adm_projects: "Projects and members", adm_admin_only: "Only admins of this project see this page.",
    adm_owner_only: "Only the owner downloads backups: a backup holds every project.",
    adm_intro_notifications: "Channels, rules, test messages and the delivery history (ql3 notify).",
    adm_intro_retention: "How long runs and logs are kept (ql3 project retention).",
    adm_intro_backup: "A consistent copy of the SQLite database, taken while the server runs (ql3 db backup).",
    adm_intro_projects: "Projects, and who holds which role in them (ql3 project, ql3 token).",
    channels: "Channels", channel: "Channel", kind: "Kind", scheme: "Scheme", no_channels: "No channels.",
    add_channel: "Add channel", url: "URL", url_hint: "A webhook's http(s) URL, or an apprise URL (tgram://, mailto://…). It is never shown again.",
    secret: "Signing secret (optional)", secret_once: "The webhook signing secret, shown only this once:",
    channel_added: "Channel {name} added.", channel_removed: "Channel {name} removed.",
    remove: "Remove", remove_channel_confirm: "Remove channel {name} with its rules and undelivered messages?",
    test_send: "Send test", test_queued: "Test message to {name} queued; its delivery shows below.",
    rules: "Rules", no_rules: "No rules.", add_rule: "Add rule", events: "Events", every_task: "every task",
    task_optional: "Task (empty: every task)", rule_added: "Rule added.", rule_removed: "Rule removed.",
    remove_rule_confirm: "Remove this rule?", pick_event: "Pick at least one event.",
    deliveries: "Delivery history", no_deliveries: "No deliveries yet (settled ones are kept a week).",
    event: "Event", attempts: "Attempts", last_error: "Last error", created: "Created", updated: "Updated",
    more: "More", removed_channel: "(removed)",
    keep_days: "Keep runs for (days)", runs_per_task: "Runs kept per task", log_bytes: "Log bytes kept per run",
    empty_is_off: "Empty: no limit.", save: "Save", retention_saved: "Retention saved (version {version}).",
    forever: "forever", all_runs: "all", no_cap: "no cap", policy_version: "Version", last_changed: "Changed",
    backup_download: "Download backup", backup_done: "Backup downloaded: {bytes} bytes, schema version {version}.",
    backup_hint: "Run logs are files under $QL3_HOME/worker/logs and are not in it. Restore with: ql3 db restore FILE (server stopped). PostgreSQL: use pg_dump.",
    projects: "Projects", project_name: "Project name", create_project: "Create project", role: "Role",
    project_created: "Project {name} created.", owner_creates: "Only the owner creates projects.",
    members: "Members of {project}", member: "Member", no_members: "No members.", add_member: "Add member",
    member_token: "The new member's token, shown only this once:", member_added: "{name} added as {role}.",
    remove_member_confirm: "Remove {name} from {project}? Their token is refused at once.",
    member_removed: "{name} removed.", state: "State", active: "active", revoked: "revoked", name: "Name",
    actions: "Actions", show_members: "Members", none: "none",
  }, {
    adm_title: "管理", adm_notifications: "通知", adm_retention: "保留策略", adm_backup: "备份",
    adm_projects: "项目与成员", adm_admin_only: "只有本项目的管理员能查看此页。",
    adm_owner_only: "只有所有者能下载备份：备份包含所有项目。",
    adm_intro_notifications: "通知渠道、规则、测试消息与发送记录（ql3 notify）。",
    adm_intro_retention: "运行记录与日志保留多久（ql3 project retention）。",
    adm_intro_backup: "服务器运行时获取的 SQLite 数据库一致副本（ql3 db backup）。",
    adm_intro_projects: "项目及其成员的角色（ql3 project、ql3 token）。",
    channels: "渠道", channel: "渠道", kind: "类型", scheme: "协议", no_channels: "没有渠道。",
    add_channel: "添加渠道", url: "URL", url_hint: "Webhook 的 http(s) 地址，或 apprise 地址（tgram://、mailto://…）。保存后不再显示。",
    secret: "签名密钥（可选）", secret_once: "Webhook 签名密钥（仅显示一次）：",
    channel_added: "已添加渠道 {name}。", channel_removed: "已删除渠道 {name}。",
    remove: "删除", remove_channel_confirm: "删除渠道 {name} 及其规则和未发送的消息？",
    test_send: "发送测试", test_queued: "已排队发送到 {name} 的测试消息；发送结果见下方。",
    rules: "规则", no_rules: "没有规则。", add_rule: "添加规则", events: "事件", every_task: "所有任务",
    task_optional: "任务（留空：所有任务）", rule_added: "已添加规则。", rule_removed: "已删除规则。",
    remove_rule_confirm: "删除此规则？", pick_event: "请至少选择一个事件。",
    deliveries: "发送记录", no_deliveries: "还没有发送记录（已结束的保留一周）。",
    event: "事件", attempts: "尝试次数", last_error: "最近错误", created: "创建", updated: "更新",
    more: "更多", removed_channel: "（已删除）",
    keep_days: "运行记录保留天数", runs_per_task: "每个任务保留的运行数", log_bytes: "每次运行保留的日志字节数",
    empty_is_off: "留空：不限制。", save: "保存", retention_saved: "保留策略已保存（版本 {version}）。",
    forever: "永久", all_runs: "全部", no_cap: "不限", policy_version: "版本", last_changed: "修改于",
    backup_download: "下载备份", backup_done: "备份已下载：{bytes} 字节，数据库结构版本 {version}。",
    backup_hint: "运行日志是 $QL3_HOME/worker/logs 下的文件，不在备份中。恢复：ql3 db restore FILE（先停止服务器）。PostgreSQL 请使用 pg_dump。",
    projects: "项目", project_name: "项目名称", create_project: "创建项目", role: "角色",
    project_created: "已创建项目 {name}。", owner_creates: "只有所有者能创建项目。",
    members: "{project} 的成员", member: "成员", no_members: "没有成员。", add_member: "添加成员",
    member_token: "新成员的令牌（仅显示一次）：", member_added: "已添加 {name}，角色 {role}。",
    remove_member_confirm: "将 {name} 从 {project} 移除？其令牌立即失效。",
    member_removed: "已移除 {name}。", state: "状态", active: "有效", revoked: "已吊销", name: "名称",
    actions: "操作", show_members: "成员", none: "无",
  });

  api.labels("notify_event", {}, { failed: "失败", timed_out: "超时", lost: "失联", cancellation_blocked: "取消被阻塞",
    approval_requested: "请求审批", cron_late: "定时触发延迟", script: "脚本消息", succeeded: "成功", test: "测试" });
  api.labels("delivery", {}, { pending: "待发送", leased: "发送中", delivered: "已送达", dead: "已放弃" });
  api.labels("role", {}, { viewer: "查看者", operator: "操作员", approver: "审批人", admin: "管理员" });

  function header(section) {
    const tabs = el("nav", { class: "subnav", "aria-label": t("adm_title") }, SECTIONS.map((s) => el("a", {
      href: "#/admin/" + s, "data-section": s, text: t("adm_" + s), "aria-current": s === section ? "page" : null,
    })));
    return [el("h1", { text: section ? t("adm_" + section) : t("adm_title") }), tabs];
  }

  function adminOnly(view, section) {
    if (can("project.admin")) return false;
    put(view, header(section), el("p", { class: "notice", id: "admin-only", text: t("adm_admin_only") }));
    return true;
  }

  function input(name, label, props) {
    const field = el("input", Object.assign({ name: name, "aria-label": label }, props || {}));
    return [field, el("label", {}, label, field)];
  }

  function optionalInt(value) {
    const text = value.trim();
    return text === "" ? null : Number(text);
  }

  // --- #/admin: an index of the sections -----------------------------------------------------------
  async function pageIndex(view) {
    put(view, header(null), el("ul", { class: "admin-index" }, SECTIONS.map((s) => el("li", {},
      el("a", { href: "#/admin/" + s, text: t("adm_" + s) }), " — ", el("span", { class: "muted", text: t("adm_intro_" + s) })))));
  }

  // --- #/admin/notifications ------------------------------------------------------------------------
  async function pageNotifications(view, mine) {
    if (adminOnly(view, "notifications")) return;
    const base = pp("/notifications");
    const [channelPage, rulePage] = await Promise.all([get(base + "/channels"), get(base + "/rules")]);
    if (!current(mine)) return;
    const channelBox = el("div");
    const ruleBox = el("div");
    const historyBox = el("div", { id: "delivery-history" });
    const shown = el("div");
    let channels = channelPage.items;

    const reload = async () => {
      const [c, r] = await Promise.all([get(base + "/channels"), get(base + "/rules")]);
      if (!current(mine)) return;
      channels = c.items;
      drawChannels();
      drawRules(r.items);
      fillChannelPick();
    };

    function drawChannels() {
      put(channelBox, table([t("name"), t("kind"), t("scheme"), t("created"), t("actions")], channels.map((c) => ({
        id: c.name,
        cells: [c.name, c.kind, c.scheme + "://", when(c.created_at_ms), el("span", { class: "actions" },
          btn(t("test_send"), async () => {
            try {
              await post(base + "/channels/" + enc(c.name) + "/test");
              say(t("test_queued", { name: c.name }));
              await history.first();
            } catch (e) { fail(e); }
          }, null, { "data-action": "test" }),
          btn(t("remove"), async () => {
            if (!(await confirmAction(t("remove_channel_confirm", { name: c.name }), t("remove")))) return;
            try {
              await request("DELETE", base + "/channels/" + enc(c.name));
              say(t("channel_removed", { name: c.name }));
              await reload();
            } catch (e) { fail(e); }
          }, "danger", { "data-action": "remove" }))],
      })), t("no_channels"), t("channels")));
    }

    function drawRules(items) {
      put(ruleBox, table([t("channel"), t("task"), t("events"), t("created"), t("actions")], items.map((r) => ({
        id: r.id,
        cells: [r.channel, r.task || t("every_task"), r.events.map((e) => lbl("notify_event", e)).join(", "),
          when(r.created_at_ms),
          btn(t("remove"), async () => {
            if (!(await confirmAction(t("remove_rule_confirm"), t("remove")))) return;
            try {
              await request("DELETE", base + "/rules/" + enc(r.id));
              say(t("rule_removed"));
              await reload();
            } catch (e) { fail(e); }
          }, "danger", { "data-action": "remove" })],
      })), t("no_rules"), t("rules")));
    }

    // the channel form (ql3 notify channel add)
    const [name, nameLabel] = input("channel_name", t("name"), { required: true, maxlength: 64, autocomplete: "off" });
    const kind = el("select", { name: "channel_kind", "aria-label": t("kind") },
      ["webhook", "apprise"].map((k) => el("option", { value: k, text: k })));
    const [url, urlLabel] = input("channel_url", t("url"), { required: true, maxlength: 2048, autocomplete: "off",
      type: "password", "aria-describedby": "channel-url-hint" });
    const [secret, secretLabel] = input("channel_secret", t("secret"), { maxlength: 256, autocomplete: "off", type: "password" });
    const channelForm = el("form", { id: "channel-form", class: "filters", "aria-label": t("add_channel") },
      nameLabel, el("label", {}, t("kind"), kind), urlLabel, secretLabel,
      el("button", { type: "submit", class: "primary", text: t("add_channel") }),
      el("p", { id: "channel-url-hint", class: "muted wide", text: t("url_hint") }));
    kind.addEventListener("change", () => { secretLabel.hidden = kind.value !== "webhook"; });
    channelForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const body = { name: name.value.trim(), kind: kind.value, url: url.value.trim() };
      if (kind.value === "webhook" && secret.value) body.secret = secret.value;
      try {
        const res = await post(base + "/channels", body);
        say(t("channel_added", { name: res.body.name }));
        put(shown, res.body.secret ? el("p", { class: "notice", id: "channel-secret" }, t("secret_once"), " ",
          el("code", { text: res.body.secret })) : null);
        channelForm.reset();
        secretLabel.hidden = false;
        await reload();
      } catch (e) { fail(e); }
    });

    // the rule form (ql3 notify rule add)
    const channelPick = el("select", { name: "rule_channel", "aria-label": t("channel"), required: true });
    function fillChannelPick() {
      const keep = channelPick.value;
      put(channelPick, channels.map((c) => el("option", { value: c.name, text: c.name })));
      if (channels.some((c) => c.name === keep)) channelPick.value = keep;
    }
    const [task, taskLabel] = input("rule_task", t("task_optional"), { maxlength: 128, autocomplete: "off" });
    const boxes = EVENTS.map((e) => el("input", { type: "checkbox", name: "rule_event", value: e, checked: DEFAULT_EVENTS.has(e) }));
    const ruleForm = el("form", { id: "rule-form", class: "filters", "aria-label": t("add_rule") },
      el("label", {}, t("channel"), channelPick), taskLabel,
      el("fieldset", { class: "events" }, el("legend", { text: t("events") }),
        boxes.map((b) => el("label", { class: "check" }, b, lbl("notify_event", b.value)))),
      el("button", { type: "submit", class: "primary", text: t("add_rule") }));
    ruleForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const events = boxes.filter((b) => b.checked).map((b) => b.value);
      if (!events.length) { say(t("pick_event"), true); return; }
      try {
        await post(base + "/rules", { channel: channelPick.value, task: task.value.trim() || null, events: events });
        say(t("rule_added"));
        task.value = "";
        await reload();
      } catch (e) { fail(e); }
    });

    // the delivery history, newest first; "More" follows the cursor; the first page refreshes itself
    const history = (() => {
      let items = [];
      let next = null;
      const draw = () => put(historyBox, table([t("created"), t("channel"), t("event"), t("state"), t("attempts"),
        t("last_error"), t("updated")], items.map((d) => ({
        id: d.id,
        cells: [when(d.created_at_ms), d.channel === null ? t("removed_channel") : d.channel, lbl("notify_event", d.event),
          badge(d.status, lbl("delivery", d.status)), String(d.attempts), d.last_error || "", when(d.updated_at_ms)],
      })), t("no_deliveries"), t("deliveries")),
      next ? el("p", { class: "actions" }, btn(t("more"), () => more().catch(fail), null, { id: "history-more" })) : null);
      async function first() {
        const page = await get(base + "/deliveries?limit=" + HISTORY_PAGE);
        if (!current(mine)) return;
        const older = items.slice(HISTORY_PAGE); // rows "More" loaded stay below the fresh first page
        const fresh = new Set(page.items.map((d) => d.id));
        items = page.items.concat(older.filter((d) => !fresh.has(d.id)));
        if (!older.length) next = page.next_cursor;
        draw();
      }
      async function more() {
        if (!next) return;
        const page = await get(base + "/deliveries?limit=" + HISTORY_PAGE + "&cursor=" + enc(next));
        if (!current(mine)) return;
        const seen = new Set(items.map((d) => d.id));
        items = items.concat(page.items.filter((d) => !seen.has(d.id)));
        next = page.next_cursor;
        draw();
      }
      return { first: first };
    })();

    drawChannels();
    drawRules(rulePage.items);
    fillChannelPick();
    await history.first();
    if (!current(mine)) return;
    put(view, header("notifications"),
      el("section", { "aria-labelledby": "h-channels" }, el("h2", { id: "h-channels", text: t("channels") }),
        channelForm, shown, channelBox),
      el("section", { "aria-labelledby": "h-rules" }, el("h2", { id: "h-rules", text: t("rules") }), ruleForm, ruleBox),
      el("section", { "aria-labelledby": "h-deliveries" }, el("h2", { id: "h-deliveries", text: t("deliveries") }), historyBox));
    setRefresh(() => history.first());
  }

  // --- #/admin/retention ----------------------------------------------------------------------------
  async function pageRetention(view, mine) {
    const policy = await get(pp("/retention"));
    if (!current(mine)) return;
    const facts = el("div");
    const show = (p) => put(facts, fields([
      [t("keep_days"), p.keep_days === null ? t("forever") : String(p.keep_days)],
      [t("runs_per_task"), p.runs_per_task === null ? t("all_runs") : String(p.runs_per_task)],
      [t("log_bytes"), p.log_bytes_per_run === null ? t("no_cap") : String(p.log_bytes_per_run)],
      [t("policy_version"), String(p.version)],
      [t("last_changed"), p.updated_at_ms ? when(p.updated_at_ms) : t("none")],
    ]));
    show(policy);
    let form = null;
    if (can("project.admin")) {
      const value = (v) => (v === null ? "" : String(v));
      const [days, daysLabel] = input("keep_days", t("keep_days"), { type: "number", min: 1, max: 36500, value: value(policy.keep_days) });
      const [runs, runsLabel] = input("runs_per_task", t("runs_per_task"), { type: "number", min: 1, max: 100000000, value: value(policy.runs_per_task) });
      const [bytes, bytesLabel] = input("log_bytes_per_run", t("log_bytes"), { type: "number", min: 1024, value: value(policy.log_bytes_per_run) });
      form = el("form", { id: "retention-form", class: "filters", "aria-label": t("adm_retention") },
        daysLabel, runsLabel, bytesLabel, el("button", { type: "submit", class: "primary", text: t("save") }),
        el("p", { class: "muted wide", text: t("empty_is_off") }));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        try {
          const res = await request("PUT", pp("/retention"), {
            keep_days: optionalInt(days.value), runs_per_task: optionalInt(runs.value),
            log_bytes_per_run: optionalInt(bytes.value),
          });
          say(t("retention_saved", { version: res.body.version }));
          if (current(mine)) show(res.body);
        } catch (e) { fail(e); }
      });
    }
    put(view, header("retention"), el("section", {}, el("p", { class: "muted", text: t("adm_intro_retention") }), facts),
      form ? el("section", {}, form) : null);
  }

  // --- #/admin/backup -------------------------------------------------------------------------------
  async function pageBackup(view, mine) {
    const who = await get("/whoami");
    if (!current(mine)) return;
    if (!who.is_owner) {
      put(view, header("backup"), el("p", { class: "notice", id: "owner-only", text: t("adm_owner_only") }));
      return;
    }
    const download = btn(t("backup_download"), async () => {
      download.disabled = true;
      try {
        const resp = await request("GET", "/backup", null, true);
        const blob = await resp.blob();
        const disposition = resp.headers.get("Content-Disposition") || "";
        const match = /filename="?([A-Za-z0-9._-]+)"?/.exec(disposition);
        const a = el("a", { href: URL.createObjectURL(blob), download: match ? match[1] : "ql3-backup.db", hidden: true });
        document.body.append(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(a.href), 60000);
        say(t("backup_done", { bytes: blob.size, version: resp.headers.get("X-Ql3-Schema-Version") || "?" }));
      } catch (e) {
        fail(e);
      } finally {
        download.disabled = false;
      }
    }, "primary", { id: "backup-download" });
    put(view, header("backup"), el("section", {}, el("p", { text: t("adm_intro_backup") }),
      el("p", { class: "actions" }, download), el("p", { class: "muted", text: t("backup_hint") })));
  }

  // --- #/admin/projects -----------------------------------------------------------------------------
  async function pageProjects(view, mine, params) {
    const [who, first] = await Promise.all([get("/whoami"), get("/projects?limit=200")]);
    if (!current(mine)) return;
    let projects = first.items;
    let next = first.next_cursor;
    const listBox = el("div");
    const memberBox = el("section", { id: "members", "aria-labelledby": "h-members", hidden: true });
    const chosen = params.get("project");

    function drawProjects() {
      put(listBox, table([t("name"), t("role"), t("created"), t("actions")], projects.map((p) => ({
        id: p.name,
        cells: [p.name, p.role ? lbl("role", p.role) : "", when(p.created_at_ms),
          p.role === "admin" ? el("a", { href: "#/admin/projects?project=" + enc(p.name), class: "button",
            "data-action": "members", text: t("show_members") }) : ""],
      })), t("none"), t("projects")),
      next ? el("p", { class: "actions" }, btn(t("more"), async () => {
        try {
          const page = await get("/projects?limit=200&cursor=" + enc(next));
          if (!current(mine)) return;
          projects = projects.concat(page.items);
          next = page.next_cursor;
          drawProjects();
        } catch (e) { fail(e); }
      })) : null);
    }

    async function drawMembers(name) {
      const base = "/projects/" + enc(name) + "/tokens";
      const page = await get(base);
      if (!current(mine)) return;
      const shown = el("div");
      const rows = el("div");
      const draw = (items) => put(rows, table([t("member"), t("role"), t("created"), t("state"), t("actions")], items.map((m) => ({
        id: m.name,
        cells: [m.name, lbl("role", m.role), when(m.created_at_ms),
          m.revoked_at_ms ? badge("revoked", t("revoked")) : badge("enabled", t("active")),
          m.revoked_at_ms ? "" : btn(t("remove"), async () => {
            if (!(await confirmAction(t("remove_member_confirm", { name: m.name, project: name }), t("remove")))) return;
            try {
              await post(base + "/" + enc(m.id) + "/revoke");
              say(t("member_removed", { name: m.name }));
              const again = await get(base);
              if (current(mine)) draw(again.items);
            } catch (e) { fail(e); }
          }, "danger", { "data-action": "remove" })],
      })), t("no_members"), t("members", { project: name })));
      draw(page.items);
      const [member, memberLabel] = input("member_name", t("name"), { required: true, maxlength: 128, autocomplete: "off" });
      const role = el("select", { name: "member_role", "aria-label": t("role") },
        ROLES.map((r) => el("option", { value: r, text: lbl("role", r) })));
      const form = el("form", { id: "member-form", class: "filters", "aria-label": t("add_member") },
        memberLabel, el("label", {}, t("role"), role), el("button", { type: "submit", class: "primary", text: t("add_member") }));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        try {
          const res = await post(base, { name: member.value.trim(), role: role.value });
          say(t("member_added", { name: res.body.name, role: lbl("role", res.body.role) }));
          put(shown, el("p", { class: "notice", id: "member-token" }, t("member_token"), " ", el("code", { text: res.body.token })));
          form.reset();
          const again = await get(base);
          if (current(mine)) draw(again.items);
        } catch (e) { fail(e); }
      });
      put(memberBox, el("h2", { id: "h-members", text: t("members", { project: name }) }), form, shown, rows);
      memberBox.hidden = false;
    }

    let createForm = null;
    if (who.is_owner) {
      const [pname, pnameLabel] = input("project_name", t("project_name"), { required: true, maxlength: 64, autocomplete: "off" });
      createForm = el("form", { id: "project-form", class: "filters", "aria-label": t("create_project") },
        pnameLabel, el("button", { type: "submit", class: "primary", text: t("create_project") }));
      createForm.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        try {
          const res = await post("/projects", { name: pname.value.trim() });
          say(t("project_created", { name: res.body.name }));
          go("#/admin/projects?project=" + enc(res.body.name));
        } catch (e) { fail(e); }
      });
    }
    drawProjects();
    if (chosen && projects.some((p) => p.name === chosen && p.role === "admin")) await drawMembers(chosen);
    if (!current(mine)) return;
    put(view, header("projects"),
      el("section", { "aria-labelledby": "h-projects" }, el("h2", { id: "h-projects", text: t("projects") }),
        createForm || el("p", { class: "muted", text: t("owner_creates") }), listBox),
      memberBox);
  }

  api.page("admin", (view, mine, parts, params) => {
    const section = parts[1] || "";
    if (section === "notifications") return pageNotifications(view, mine);
    if (section === "retention") return pageRetention(view, mine);
    if (section === "backup") return pageBackup(view, mine);
    if (section === "projects") return pageProjects(view, mine, params);
    if (section) throw new ApiError(404, "not_found", "no such page");
    return pageIndex(view);
  });
});
