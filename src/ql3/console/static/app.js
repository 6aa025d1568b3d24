"use strict";
// ql3 console: hash-routed pages (overview, tasks, runs, approvals, workers, tokens, dependencies) over /api/v1.
// Every value from the API reaches the page through textContent, an attribute or a form value, never
// as markup; log text is parsed for ANSI colours into text nodes inside spans with fixed class names.
(function () {
  const session = window.sessionStorage;
  const prefs = window.localStorage;
  const TOKEN_KEY = "ql3.token";
  const PROJECT_KEY = "ql3.project";
  const ME_KEY = "ql3.me"; // the principal id, learned from whoami or from our own requests
  const TERMINAL = new Set(["succeeded", "failed", "cancelled", "timed_out"]);
  const STATUSES = ["created", "queued", "dispatching", "running", "waiting_approval", "retry_wait", "lost",
    "succeeded", "failed", "cancelled", "timed_out"];
  const TRIGGERS = ["manual", "cron", "approval", "retry"];
  const REJECT_REASONS = ["not_expected", "wrong_revision", "bad_timing", "needs_review", "other"];
  const RANGES = { "1h": 3600e3, "24h": 86400e3, "7d": 7 * 86400e3 };
  const PERMS = {
    viewer: ["run.read", "task.read", "worker.read"],
    operator: ["run.read", "task.read", "worker.read", "run.create", "run.stop", "task.write"],
    approver: ["run.read", "task.read", "worker.read", "approval.decide", "approval.recover"],
    admin: ["run.read", "task.read", "worker.read", "run.create", "run.stop", "task.write", "approval.decide",
      "approval.recover", "token.create", "worker.manage", "project.admin"],
    metrics: ["metrics.read"], // a Prometheus scrape token (docs/operations.md "Prometheus")
  };
  const REFRESH_MS = 5000;
  const LOG_POLL_MS = 1000;
  const LOG_PAGE = 65536;
  const MAX_LOG_CHARS = 1048576; // the log view keeps the last 1 MiB of text
  const MAX_REFRESH_PAGES = 5;

  // --- labels: English and Chinese ------------------------------------------------------------------
  const I18N = {
    en: {
      menu: "Menu", nav_overview: "Overview", nav_tasks: "Tasks", nav_runs: "Runs", nav_approvals: "Approvals",
      nav_workers: "Workers", nav_tokens: "Tokens", nav_variables: "Variables",
      value: "Value", secret: "secret", hidden: "hidden",
      no_variables: "No variables.", set_variable: "Save variable", secret_write_only: "Secret (write-only, encrypted)",
      variables_help: "Every task of the project gets the enabled variables in its environment; a task's own value wins. A secret is never shown again.",
      var_delete_confirm: "Delete variable {name}? Tasks no longer get it.", var_deleted: "Variable {name} deleted.",
      var_saved: "Variable {name} saved.", import_variables: "Import", import_help: "KEY=VALUE lines or QingLong's env export (JSON)",
      import_as_secrets: "Import as secrets", var_imported: "{n} variables imported.", project: "Project", sign_out: "Sign out", keep: "Keep",
      nav_deps: "Dependencies", deps_kind: "Kind", deps_spec: "Requirement", deps_add: "Add and install",
      deps_none: "No dependencies.", deps_hint: "Python: a PEP 508 requirement (requests==2.32.*). Node: an npm name and an optional range (axios@^1.7). Each change installs the whole set in a run of the task ql3-deps.",
      deps_install_run: "Install run:", deps_unchanged: "Already in the set: nothing to install.", deps_install_again: "Install again",
      deps_remove_confirm: "Remove {name}? The remaining set is installed again.", remove: "Remove",
      nav_scripts: "Scripts", nav_subscriptions: "Subscriptions", path: "Path", bytes: "Bytes", by: "By",
      no_scripts: "No script yet.", new_script: "New script", content: "Content", history: "History",
      source: "Source", show_diff: "Diff", rev_deleted: "Deleted",
      script_saved: "Saved as revision {rev}.", script_unchanged: "Nothing changed.", script_delete_confirm: "Delete script {path}? Its history stays; tasks running it will fail to start.",
      sync_of: "Sync {status}", last_sync: "Last sync", never_synced: "Not synced yet.", sync_now: "Sync now", syncing: "Syncing…",
      subscription_delete_confirm: "Remove subscription {name}? Its scripts and tasks stay.", subscription_added: "Subscription {name} added.",
      new_subscription: "New subscription", repository: "Repository", branch: "Branch", path_glob: "Files (glob)",
      deploy_key: "Deploy key", no_subscriptions: "No subscription yet.", yes: "yes", no: "no", add: "Add",
      offline: "The server is unreachable; what you see may be stale.",
      sign_in: "Sign in", token: "Token", sign_in_hint: "Paste a bearer token. The owner's token is in $QL3_HOME/credentials; `ql3 token create` makes more.",
      signed_in_as: "Signed in as {name} ({role})", signed_in_role: "Signed in ({role})",
      running_now: "Running now", failed_24h: "Failed or timed out, last 24 h", next_fires: "Next cron fires",
      pending_approvals: "Pending approvals", capacity: "Worker capacity", slots_busy: "{busy} of {slots} slots busy, {online} online",
      health: "Cancellation health", health_wait: "Cancellations are in progress; they converge on their own.",
      health_inspect: "Some cancellations are blocked: open them to rearm (or `ql3 run blocked`).",
      nothing_running: "Nothing is running.", no_failures: "No failures in the last 24 hours.",
      no_cron: "No task has a schedule.", no_pending: "Nothing waits for approval.", no_workers: "No worker is registered.",
      new_task: "New task", name: "Name", revision: "Revision", enabled: "Enabled", disabled: "Disabled",
      cron: "Cron", next_fire: "Next fire", approval: "Approval", actions: "Actions", run_now: "Run now",
      enable: "Enable", disable: "Disable", edit: "Edit", clone: "Clone", delete: "Delete", no_tasks: "No tasks yet.",
      command: "Command", command_hidden: "Hidden for your role (editors and approvers see it).",
      cwd: "Working directory", cwd_default: "default", cwd_set: "set (hidden for your role)",
      env_keys: "Env keys", timeout: "Timeout", grace: "Grace", placement: "Placement", overlap: "Overlap",
      misfire: "Misfire", max_attempts: "Max attempts", none: "none", revisions: "Revisions", run_history: "Run history",
      misfire_grace: "Misfire grace", random_delay: "Random delay", on_start: "Runs at server start",
      skipped: "Skipped occurrences", no_skipped: "No skipped occurrences.",
      first_revision: "first revision", no_change: "no change", save: "Save", create: "Create", cancel_edit: "Back",
      env_lines: "Env (KEY=VALUE per line)", env_keep: "Leave empty to keep the current env ({keys}); lines replace it.",
      require: "Require labels (k=v, comma-separated)", timeout_s: "Timeout (90, 5m, 1h30m)", grace_s: "Grace (5s)",
      bad_duration: "{field}: write seconds (90) or units such as 90s, 5m, 1h30m",
      delete_confirm: "Delete task {name}? Its runs stay.", deleted: "Task {name} deleted.",
      created_task: "Task {name} created.", published: "Revision {rev} published: {changes}.", unchanged: "Nothing changed.",
      run: "Run", task: "Task", status: "Status", trigger: "Trigger", attempt: "Attempt", created: "Created",
      started: "Started", finished: "Finished", duration: "Duration", exit: "Exit", any: "any",
      time_range: "Time", since: "Since", until: "Until", custom: "custom", last: "last {range}",
      failed_or_timed_out: "failed or timed out", older: "Older runs", no_runs: "No runs match.",
      waiting: "waiting: {reason}", cancel_run: "Cancel run", rerun: "Re-run", download: "Download log",
      cancel_confirm: "Cancel run {id} of {task}? Its processes get TERM, then KILL after the grace period.",
      cancel_yes: "Cancel run", cancel_requested: "Cancel requested for run {id}.", timeline: "Timeline", log: "Log",
      search: "Search the log", matches: "{n} matches", prev: "Previous", next: "Next", pause: "Pause follow",
      resume: "Follow", jump_end: "Jump to end", log_empty: "(no output yet)", log_done: "The run has ended.",
      following: "Following the log…", error_code: "Error", cancel_reason: "Cancel reason", priority: "Priority",
      started_run: "Run {id} of {task} queued.", approval_requested: "Approval requested for {task}; an approver decides.",
      requested_by: "Requested by", requested: "Requested", expires: "Expires", state: "State", you: "you",
      approve: "Approve", reject: "Reject", reason: "Reason", free_text: "Note (optional)", note: "Note",
      revision_gone: "Revision {revision} is no longer kept.", task_now_at: "the task is now at {revision}", what_runs: "What will run",
      own_request: "Your own request: another approver decides.", decided: "Recent decisions", approved: "Approved.",
      rejected: "Rejected.", no_approvals: "No approval requests.", diff_prev: "Changes from the previous revision",
      worker: "Worker", slots: "Slots", labels: "Labels", executors: "Executors", heartbeat: "Heartbeat", drain: "Drain",
      drain_confirm: "Drain worker {id}? It takes no new runs; running ones go on.", drained: "Worker {id} is draining.",
      tokens_missing: "Token management is not available on this server (it needs GET …/tokens).",
      role: "Role", expires_at: "Expires", last_used: "Last used", revoked: "revoked", revoke: "Revoke", active: "active",
      revoke_confirm: "Revoke token {name}? Requests with it fail at once.", no_tokens: "No tokens.",
      new_token: "New token", token_shown_once: "The token, shown once:", never: "never", admin_only: "Only admins manage tokens.",
      not_found: "Not found.", loading: "Loading…", page_missing: "No such page.",
      filters: "Filters", id: "Id", decided_by: "Decided by", decided_at: "Decided",
      h_blocked: "Blocked", h_pending: "Pending", h_due: "Signals due", open_blocked: "Blocked cancellations",
      cancellation: "Cancellation", blocked_title: "Blocked cancellations", no_blocked: "No cancellation is blocked.",
      blocked_at: "Blocked", dispatch_status: "Dispatch", blocked_reason: "Blocked because", dispatch_attempts: "Attempts",
      last_result: "Last result", next_attempt: "Next attempt", dispatch_version: "Version", operator_action: "Next step",
      cancel_requested_at: "Cancel requested", rearm: "Rearm", rearm_delay: "Retry in (s)",
      rearm_hint: "The process could not be proven to be the run's, so no signal was sent. Rearm only once you know why: the next try checks the identity again.",
      rearm_confirm: "Rearm the cancellation of run {id}? It is blocked with {result} at version {version}; the stop is tried again in {delay} s.",
      rearmed: "Cancellation of run {id} rearmed: next try {when}.",
      stale: "It changed since it was shown ({reason}); here it is as it is now.",
      more: "More", no_dispatch: "No stop signal has been tried yet.",
      nav_actions: "Actions", actions_title: "Approved actions", no_actions: "No approved actions.",
      action: "Action", action_type: "Type", attempts: "Attempts", result: "Result", updated: "Updated",
      recovery: "Recovery", recovery_finding: "Last finding", version: "Version", approval_request: "Approval request",
      needs_person: "Needs a person", resolve: "Resolve", outcome: "What really happened", reason_code: "Reason code",
      resolve_hint: "The handler may have run, but its outcome could not be proven. It is never retried: state what happened. This is final.",
      resolve_confirm: "Record approved action {id} as {outcome}? This is final; the action is never retried.",
      resolved: "Action {id} closed as {status}.", resolve_role: "Only approvers and admins resolve actions.",
      recovery_required_n: "{n} approved actions need a person.", parked_items: "Parked items",
      parked_n: "{n} items a control loop set aside after a failure that was not an outage; each is retried with backoff while the loop goes on.",
      retry_now: "Retry now", retried: "{kind} {id} is retried now", eligible: "Eligible", lease_expires: "Lease expires",
      completed: "Completed", last_tried: "Last tried", p_require: "require", p_prefer: "prefer", oldest_blocked: "Oldest blocked",
      dispatcher_saw: "Dispatcher saw", every_queued_run: "(every queued run)", last_seen: "last seen {when}, {n}×",
      blocked_final: "Blocked: this is final",
      blocked_why: "A blocked action is never retried, and its approval is spent. Nothing here changes that.",
      blocked_next_run: "To run {task} after all, start it again: that asks for a new approval, and an approver decides.",
      blocked_next: "To do it after all, request a new approval for it; an approver decides.",
      start_again: "Start {task} again",
      jump_start: "Jump to start",
      log_searching: "Searching the whole log…",
      log_no_match: "No match in the log",
      log_no_more: "No further match",
      log_match_at: "match at {at} of {size}",
      log_range: "showing {from}–{to} of {size}",
      search: "Search", search_tasks: "Search tasks (name or id)", prev_page: "Previous page", next_page: "Next page",
      pages: "Pages", task_picker_hint: "Type a task name: the list suggests matches.",
      copy_id: "Copy id", copied_id: "Copied {id}",
      recent_runs: "Recent runs", strip_label: "The last {n} runs of {task}, oldest first: colour is the outcome, height the duration",
      strip_run: "Run {id}: {status}, {duration}, {when}", still_running: "not finished",
      runs_per_hour: "Runs per hour, last 24 h", runs_per_6h: "Runs per 6 hours, last 7 days",
      busy_slots: "Busy slots per hour, last 24 h", busy_legend: "busy slots (mean)", capacity_legend: "slots online now",
      bucket_runs: "{from}: {n} runs {parts}", bucket_busy: "{from}: {busy} busy slots of {capacity}",
      chart_runs_label: "{n} runs finished, {failed} failed or timed out", chart_busy_label: "Busy slots; peak {peak} of {capacity}",
      no_runs_yet: "No finished runs yet.",
      theme_auto: "Auto", theme_light: "Light", theme_dark: "Dark", theme_label: "Theme: {theme} (change)",
      nav_admin: "Admin", err_client: "Error in the page",
      err_network_error: "The server did not answer", err_unauthenticated: "Not signed in or the token is no longer valid",
      err_permission_denied: "Your role does not allow this", err_not_found: "Not found",
      err_validation_failed: "Invalid input", err_conflict: "It changed meanwhile", err_name_taken: "The name is taken",
      err_storage_busy: "The server is busy; try again", err_egress_refused: "The server may not send to that address",
      err_backup_not_supported: "Online backup works on SQLite only; use pg_dump for PostgreSQL",
      user_name: "Name", password: "Password", totp_code: "Code from your authenticator app", use_token: "Or sign in with a token",
      sign_in_pw_hint: "A name and password an admin gave you (`ql3 user add`).",
      totp_needed: "Enter the 6-digit code from your authenticator app.", nav_sessions: "Sessions",
      sessions_intro: "Where you are signed in to the console. Revoke a session to sign it out at once.",
      this_session: "this session", no_sessions: "No console sessions (signed in with a token).", client: "Client",
      browser: "Browser", idle_end: "Idle end", session_end: "Ends", revoke_session_confirm: "Sign out this session?",
    },
    zh: {
      menu: "菜单", nav_overview: "概览", nav_tasks: "任务", nav_runs: "运行", nav_approvals: "审批",
      nav_workers: "工作节点", nav_tokens: "令牌", nav_variables: "环境变量",
      value: "值", secret: "密钥", hidden: "已隐藏",
      no_variables: "没有环境变量。", set_variable: "保存变量", secret_write_only: "密钥（只写，加密保存）",
      variables_help: "项目的每个任务都会在环境中获得已启用的变量；任务自己的值优先。密钥保存后不再显示。",
      var_delete_confirm: "删除变量 {name}？任务将不再获得它。", var_deleted: "变量 {name} 已删除。",
      var_saved: "变量 {name} 已保存。", import_variables: "导入", import_help: "KEY=VALUE 行或青龙导出的环境变量（JSON）",
      import_as_secrets: "作为密钥导入", var_imported: "已导入 {n} 个变量。", project: "项目", sign_out: "退出", keep: "保留",
      nav_deps: "依赖", deps_kind: "类型", deps_spec: "依赖项", deps_add: "添加并安装",
      deps_none: "没有依赖。", deps_hint: "Python：PEP 508 依赖（requests==2.32.*）。Node：npm 包名和可选版本范围（axios@^1.7）。每次修改都由任务 ql3-deps 的一次运行安装全部依赖。",
      deps_install_run: "安装运行：", deps_unchanged: "已在依赖中，无需安装。", deps_install_again: "重新安装",
      deps_remove_confirm: "删除 {name}？其余依赖将重新安装。", remove: "删除",
      nav_scripts: "脚本", nav_subscriptions: "订阅", path: "路径", bytes: "字节", by: "修改者",
      no_scripts: "还没有脚本。", new_script: "新建脚本", content: "内容", history: "历史",
      source: "来源", show_diff: "差异", rev_deleted: "已删除",
      script_saved: "已保存为版本 {rev}。", script_unchanged: "没有变化。", script_delete_confirm: "删除脚本 {path}？历史会保留；运行它的任务将无法启动。",
      sync_of: "同步{status}", last_sync: "上次同步", never_synced: "尚未同步。", sync_now: "立即同步", syncing: "同步中…",
      subscription_delete_confirm: "删除订阅 {name}？它的脚本和任务会保留。", subscription_added: "已添加订阅 {name}。",
      new_subscription: "新建订阅", repository: "仓库", branch: "分支", path_glob: "文件（通配）",
      deploy_key: "部署密钥", no_subscriptions: "还没有订阅。", yes: "是", no: "否", add: "添加",
      offline: "无法连接服务器；页面内容可能已过时。",
      sign_in: "登录", token: "令牌", sign_in_hint: "粘贴访问令牌。所有者令牌在 $QL3_HOME/credentials；用 `ql3 token create` 创建更多。",
      signed_in_as: "已登录：{name}（{role}）", signed_in_role: "已登录（{role}）",
      running_now: "正在运行", failed_24h: "最近 24 小时失败或超时", next_fires: "即将触发的定时任务",
      pending_approvals: "待审批", capacity: "工作节点容量", slots_busy: "{slots} 个槽位中 {busy} 个占用，{online} 个在线",
      health: "取消状态", health_wait: "取消正在进行，会自行完成。", health_inspect: "有取消被阻塞：打开列表重新启用（或用 `ql3 run blocked`）。",
      nothing_running: "没有正在运行的任务。", no_failures: "最近 24 小时没有失败。", no_cron: "没有定时任务。",
      no_pending: "没有待审批的请求。", no_workers: "没有注册的工作节点。",
      new_task: "新建任务", name: "名称", revision: "版本", enabled: "已启用", disabled: "已禁用", cron: "定时",
      next_fire: "下次触发", approval: "审批", actions: "操作", run_now: "立即运行", enable: "启用", disable: "禁用",
      edit: "编辑", clone: "复制", delete: "删除", no_tasks: "还没有任务。", command: "命令",
      command_hidden: "你的角色无权查看（编辑者和审批者可见）。", cwd: "工作目录", cwd_default: "默认", cwd_set: "已设置（你的角色不可见）",
      env_keys: "环境变量名", timeout: "超时", grace: "宽限期", placement: "调度约束", overlap: "重叠策略",
      misfire: "错过触发", max_attempts: "最大尝试次数", none: "无", revisions: "版本历史", run_history: "运行历史",
      misfire_grace: "错过触发宽限", random_delay: "随机延迟", on_start: "服务启动时运行",
      skipped: "跳过的触发", no_skipped: "没有跳过的触发。",
      first_revision: "首个版本", no_change: "无变化", save: "保存", create: "创建", cancel_edit: "返回",
      env_lines: "环境变量（每行 KEY=VALUE）", env_keep: "留空则保留当前环境变量（{keys}）；填写则整体替换。",
      require: "要求标签（k=v，逗号分隔）", timeout_s: "超时（90、5m、1h30m）", grace_s: "宽限期（5s）",
      bad_duration: "{field}：请写秒数（90）或 90s、5m、1h30m 这样的时长",
      delete_confirm: "删除任务 {name}？其运行记录会保留。", deleted: "任务 {name} 已删除。", created_task: "任务 {name} 已创建。",
      published: "已发布版本 {rev}：{changes}。", unchanged: "没有变化。",
      run: "运行", task: "任务", status: "状态", trigger: "触发方式", attempt: "尝试", created: "创建时间",
      started: "开始", finished: "结束", duration: "耗时", exit: "退出码", any: "全部", time_range: "时间",
      since: "起始", until: "截止", custom: "自定义", last: "最近 {range}", failed_or_timed_out: "失败或超时",
      older: "更早的运行", no_runs: "没有匹配的运行。", waiting: "等待：{reason}", cancel_run: "取消运行", rerun: "重新运行",
      download: "下载日志", cancel_confirm: "取消任务 {task} 的运行 {id}？进程先收到 TERM，宽限期后 KILL。",
      cancel_yes: "取消运行", cancel_requested: "已请求取消运行 {id}。", timeline: "事件", log: "日志",
      search: "搜索日志", matches: "{n} 处匹配", prev: "上一个", next: "下一个", pause: "暂停跟随", resume: "跟随",
      jump_end: "跳到末尾", log_empty: "（暂无输出）", log_done: "运行已结束。", following: "正在跟随日志…",
      error_code: "错误", cancel_reason: "取消原因", priority: "优先级", started_run: "任务 {task} 的运行 {id} 已排队。",
      approval_requested: "已为 {task} 提交审批申请，等待审批者决定。", requested_by: "申请人", requested: "申请时间",
      expires: "过期时间", state: "状态", you: "你", approve: "批准", reject: "拒绝", reason: "原因", free_text: "备注（可选）", note: "备注",
      revision_gone: "版本 {revision} 已不再保留。", task_now_at: "任务当前为 {revision}",
      what_runs: "将要执行的内容", own_request: "这是你自己的申请：需要其他审批者决定。", decided: "最近的决定",
      approved: "已批准。", rejected: "已拒绝。", no_approvals: "没有审批请求。", diff_prev: "与上一版本的差异",
      worker: "工作节点", slots: "槽位", labels: "标签", executors: "执行器", heartbeat: "心跳", drain: "排空",
      drain_confirm: "排空工作节点 {id}？它不再接收新运行，已有运行继续。", drained: "工作节点 {id} 正在排空。",
      tokens_missing: "此服务器不支持令牌管理（需要 GET …/tokens）。", role: "角色", expires_at: "过期", last_used: "最近使用",
      revoked: "已吊销", revoke: "吊销", active: "有效", revoke_confirm: "吊销令牌 {name}？使用它的请求会立即失败。",
      no_tokens: "没有令牌。", new_token: "新建令牌", token_shown_once: "令牌（仅显示一次）：", never: "从不",
      admin_only: "只有管理员可以管理令牌。", not_found: "未找到。", loading: "加载中…", page_missing: "没有这个页面。",
      filters: "筛选", id: "编号", decided_by: "决定人", decided_at: "决定时间",
      h_blocked: "已阻塞", h_pending: "待发送", h_due: "待发送信号", open_blocked: "被阻塞的取消",
      cancellation: "取消", blocked_title: "被阻塞的取消", no_blocked: "没有被阻塞的取消。",
      blocked_at: "阻塞时间", dispatch_status: "信号发送", blocked_reason: "阻塞原因", dispatch_attempts: "尝试次数",
      last_result: "上次结果", next_attempt: "下次尝试", dispatch_version: "版本号", operator_action: "下一步",
      cancel_requested_at: "请求取消时间", rearm: "重新启用", rearm_delay: "重试间隔（秒）",
      rearm_hint: "无法证明该进程属于这次运行，所以没有发送信号。请在查明原因后再重新启用：下次尝试会再次核对进程身份。",
      rearm_confirm: "重新启用运行 {id} 的取消？它因 {result} 在版本 {version} 被阻塞；{delay} 秒后再次尝试停止。",
      rearmed: "运行 {id} 的取消已重新启用：下次尝试 {when}。",
      stale: "显示之后它已改变（{reason}）；以下是当前状态。",
      more: "更多", no_dispatch: "还没有尝试发送停止信号。",
      nav_actions: "已批准操作", actions_title: "已批准的操作", no_actions: "没有已批准的操作。",
      action: "操作", action_type: "类型", attempts: "尝试次数", result: "结果", updated: "更新时间",
      recovery: "恢复", recovery_finding: "最近的发现", version: "版本号", approval_request: "审批请求",
      needs_person: "需要人工处理", resolve: "处理", outcome: "实际结果", reason_code: "原因代码",
      resolve_hint: "处理程序可能已经执行，但无法证明结果。它永远不会重试：请说明实际发生了什么。此操作不可撤销。",
      resolve_confirm: "将已批准操作 {id} 记录为“{outcome}”？此操作不可撤销，该操作不会重试。",
      resolved: "操作 {id} 已关闭为 {status}。", resolve_role: "只有审批者和管理员可以处理操作。",
      recovery_required_n: "{n} 个已批准操作需要人工处理。", parked_items: "搁置的条目",
      parked_n: "{n} 个条目处理失败(非故障中断),已被控制循环搁置;循环继续处理其他条目,并按退避重试它们。",
      retry_now: "立即重试", retried: "{kind} {id} 将立即重试", eligible: "可执行时间", lease_expires: "租约到期",
      completed: "完成时间", last_tried: "上次尝试时间", p_require: "要求", p_prefer: "优先", oldest_blocked: "最早阻塞时间",
      dispatcher_saw: "分派器所见", every_queued_run: "（所有排队的运行）", last_seen: "最近一次 {when}，共 {n} 次",
      blocked_final: "已阻塞：这是最终状态",
      blocked_why: "已阻塞的操作永远不会重试，其审批已用掉。这里的任何操作都不能改变这一点。",
      blocked_next_run: "如仍要运行 {task}，请重新启动它：这会请求新的审批，由审批人决定。",
      blocked_next: "如仍要执行，请为它请求新的审批；由审批人决定。",
      start_again: "重新启动 {task}",
      jump_start: "跳到开头",
      log_searching: "正在搜索整个日志…",
      log_no_match: "日志中没有匹配项",
      log_no_more: "没有更多匹配项",
      log_match_at: "匹配位于 {at} / {size}",
      log_range: "显示 {from}–{to} / {size}",
      search: "搜索", search_tasks: "搜索任务（名称或编号）", prev_page: "上一页", next_page: "下一页",
      pages: "分页", task_picker_hint: "输入任务名称：列表会提示匹配项。",
      copy_id: "复制编号", copied_id: "已复制 {id}",
      recent_runs: "最近的运行", strip_label: "{task} 最近 {n} 次运行，从旧到新：颜色表示结果，高度表示时长",
      strip_run: "运行 {id}：{status}，{duration}，{when}", still_running: "未结束",
      runs_per_hour: "每小时运行数（最近 24 小时）", runs_per_6h: "每 6 小时运行数（最近 7 天）",
      busy_slots: "每小时占用槽位（最近 24 小时）", busy_legend: "占用槽位（平均）", capacity_legend: "当前在线槽位",
      bucket_runs: "{from}：{n} 次运行 {parts}", bucket_busy: "{from}：占用 {busy} 个槽位，共 {capacity} 个",
      chart_runs_label: "{n} 次运行结束，{failed} 次失败或超时", chart_busy_label: "占用槽位；峰值 {peak}，共 {capacity}",
      no_runs_yet: "还没有结束的运行。",
      theme_auto: "自动", theme_light: "浅色", theme_dark: "深色", theme_label: "主题：{theme}（切换）",
      nav_admin: "管理", err_client: "页面出错",
      err_network_error: "服务器没有响应", err_unauthenticated: "未登录或令牌已失效",
      err_permission_denied: "你的角色无权执行此操作", err_not_found: "未找到",
      err_validation_failed: "输入无效", err_conflict: "数据已被更改", err_name_taken: "名称已被占用",
      err_storage_busy: "服务器繁忙，请重试", err_egress_refused: "服务器不允许向该地址发送",
      err_backup_not_supported: "在线备份仅支持 SQLite；PostgreSQL 请使用 pg_dump",
      user_name: "用户名", password: "密码", totp_code: "身份验证器中的验证码", use_token: "或使用令牌登录",
      sign_in_pw_hint: "管理员为你设置的用户名和密码（`ql3 user add`）。",
      totp_needed: "请输入身份验证器中的 6 位验证码。", nav_sessions: "会话",
      sessions_intro: "你在控制台登录的地方。撤销一个会话即可立即使其退出。",
      this_session: "当前会话", no_sessions: "没有控制台会话（使用令牌登录）。", client: "客户端",
      browser: "浏览器", idle_end: "空闲到期", session_end: "到期", revoke_session_confirm: "退出此会话？",
    },
  };
  // Labels for the values the API returns (statuses, event types, triggers, results...). The value
  // itself never changes: it stays in data-value / title and in every request; only its label does.
  // English shows the value as the API spells it, except where a word is needed.
  const VALUE_LABELS = {
    en: {
      outcome: { succeeded: "succeeded", failed: "failed", abandoned: "abandoned (outcome unknown)" },
      dispatch_reason: { no_match: "no worker offers its executor type and required labels",
        plans_unavailable: "its task revision cannot be placed", claim_raced: "another claim or a stop got to it first",
        claim_budget_exhausted: "the cycle spent its claims before this run",
        recovery_plans_unavailable: "its claimed lease cannot be offered again: its pinned revision is gone",
        no_workers: "no worker was online", no_capacity: "every worker was full",
        scan_budget_exhausted: "the scan budget ended before the rest of the queue",
        recovery_budget_exhausted: "the cycle spent its budget recovering earlier claims" },
      sync: { running: "running", succeeded: "succeeded", failed: "failed (nothing changed)" },
    },
    zh: {
      sync: { running: "进行中", succeeded: "成功", failed: "失败（未做任何更改）" },
      status: { created: "已创建", queued: "排队中", dispatching: "分派中", running: "运行中", waiting_approval: "等待审批",
        retry_wait: "等待重试", lost: "失联", succeeded: "成功", failed: "失败", cancelled: "已取消", timed_out: "超时",
        claimed: "已领取", starting: "启动中" },
      trigger: { manual: "手动", cron: "定时", approval: "审批后", retry: "重新运行", approved_action: "审批后", schedule: "定时" },
      approval: { pending: "待审批", approved: "已批准", rejected: "已拒绝", consumed: "已执行", expired: "已过期" },
      action: { pending: "待执行", leased: "已领取", executing: "执行中", retry_wait: "等待重试", succeeded: "成功",
        failed: "失败", blocked: "已阻塞", recovery_required: "需要人工恢复" },
      worker: { online: "在线", draining: "排空中", expired: "已失效", offline: "离线" },
      assessment: { clear: "正常", converging: "进行中", attention_required: "需要处理" },
      dispatch: { pending: "待发送", leased: "发送中", retry_wait: "等待重试", dispatched: "已发送", blocked: "已阻塞" },
      result: { identity_mismatch: "进程身份不符", pid_mismatch: "进程号不符", unsupported: "不支持", invalid: "无效",
        controller_missing: "控制器缺失", handle_missing: "进程句柄缺失", dispatch_error: "发送出错",
        termination_requested: "已请求终止", already_exited: "进程已退出" },
      event: {
        "run.created": "运行已创建", "run.queued": "已排队", "run.dispatching": "分派中", "run.running": "开始运行",
        "run.waiting_approval": "等待审批", "run.retry_wait": "等待重试", "run.lost": "失联", "run.succeeded": "运行成功",
        "run.failed": "运行失败", "run.cancelled": "已取消", "run.timed_out": "运行超时",
        "run.cancel_requested": "已请求取消", "run.cancel_dispatched": "已发送停止信号",
        "run.cancel_dispatch_failed": "停止信号发送失败（将重试）", "run.cancel_dispatch_blocked": "取消被阻塞",
        "run.cancel_dispatch_rearmed": "取消已重新启用",
        "attempt.claimed": "尝试已领取", "attempt.starting": "尝试启动中", "attempt.running": "尝试运行中",
        "attempt.succeeded": "尝试成功", "attempt.failed": "尝试失败", "attempt.cancelled": "尝试已取消",
        "attempt.timed_out": "尝试超时", "attempt.lost": "尝试失联", "attempt.late_callback_ignored": "忽略迟到的回调", "attempt.late_fact_recorded": "记录迟到的结果",
      },
      event_key: { attempt: "尝试", exit_code: "退出码", error_code: "错误", reason: "原因", result: "结果",
        outcome: "结果", trigger_type: "触发方式", task_revision: "版本" },
      actor: { user: "用户", system: "系统", worker: "工作节点", scheduler: "调度器" },
      reason: { not_expected: "不在预期内", wrong_revision: "版本不对", bad_timing: "时机不当", needs_review: "需要审查",
        other: "其他", approved: "已批准" },
      outcome: { succeeded: "成功", failed: "失败", abandoned: "放弃（结果未知）" },
      waiting: { no_matching_worker: "没有匹配的工作节点", no_free_slot: "没有空闲槽位", worker_draining: "工作节点正在排空",
        no_worker: "没有工作节点", queued: "排队中" },
      dispatch_reason: { no_match: "没有工作节点提供其执行器类型和所需标签", plans_unavailable: "其任务版本无法放置",
        claim_raced: "另一个领取或停止抢先了", claim_budget_exhausted: "本轮的领取预算在此运行之前用完",
        recovery_plans_unavailable: "其已领取的租约无法再次提供：固定的版本已不存在", no_workers: "没有在线的工作节点",
        no_capacity: "所有工作节点都已满", scan_budget_exhausted: "扫描预算在队列其余部分之前用完",
        recovery_budget_exhausted: "本轮把预算用于恢复先前的领取" },
      cancel_reason: { user: "用户", policy: "策略", shutdown: "关闭", reconcile: "对账", timeout: "超时" },
      overlap: { allow: "允许", skip: "跳过", cancel_previous: "取消上一次" },
      misfire: { skip: "跳过", fire_once: "补触发一次" },
      approval_policy: { none: "无需审批", required: "需要审批" },
      operator_action: { rearm: "重新启用", wait: "等待", none: "无", inspect: "检查" },
      recovery: { armed: "自动检查中", manual: "等待人工", resolved: "已解决" },
      finding: { verified_succeeded: "已确认成功", verified_failed: "已确认失败", still_running: "仍在运行", missing: "缺失",
        conflict: "冲突", unsupported: "不支持", unavailable: "不可用" },
    },
  };
  let lang = prefs.getItem("ql3.lang") || ((navigator.language || "en").toLowerCase().startsWith("zh") ? "zh" : "en");
  let utc = prefs.getItem("ql3.tz") === "utc";

  function t(key, vars) {
    let s = (I18N[lang] && I18N[lang][key]) || I18N.en[key] || key;
    if (vars) for (const [k, v] of Object.entries(vars)) s = s.split("{" + k + "}").join(String(v));
    return s;
  }

  // The label of an API value of a kind ("status", "event", ...); the value itself when there is none.
  function lbl(kind, value) {
    if (value === null || value === undefined) return "";
    const table = VALUE_LABELS[lang] && VALUE_LABELS[lang][kind];
    return (table && table[value]) || String(value);
  }

  // --- DOM helpers ----------------------------------------------------------------------------------
  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = String(v);
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids.flat(4)) {
      if (kid === null || kid === undefined || kid === false) continue;
      e.append(kid instanceof Node ? kid : String(kid));
    }
    return e;
  }

  // replaceChildren without the nulls that conditional children leave (they would show as "null")
  function put(node, ...kids) {
    node.replaceChildren(...kids.flat(4).filter((k) => k !== null && k !== undefined && k !== false));
  }

  function link(href, label, cls) { return el("a", { href: href, class: cls, text: label }); }
  // A value as a badge: the class and data-value carry the API value, the text its label.
  function badge(value, label) {
    return el("span", { class: "badge badge-" + String(value).replace(/[^a-z_]/g, ""), "data-value": value,
      text: label || value });
  }
  function vbadge(kind, value) { return badge(value, lbl(kind, value)); }
  function btn(label, onClick, cls, extra) {
    return el("button", Object.assign({ type: "button", class: cls, text: label, onclick: onClick }, extra || {}));
  }
  // The start of an id, as the CLI shows and takes it (any unique prefix works there); links and the
  // copy button carry the whole id.
  function short(id) { return String(id || "").slice(0, 13); }
  function enc(s) { return encodeURIComponent(s); }

  // A table that becomes cards below 600 px: each cell carries its column name as data-label.
  function table(columns, rows, emptyText, label) {
    const head = el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col", text: c }))));
    const body = el("tbody");
    if (rows.length === 0) {
      body.append(el("tr", {}, el("td", { class: "empty", colspan: columns.length, text: emptyText })));
    }
    for (const row of rows) {
      const tr = el("tr", { "data-id": row.id || null });
      row.cells.forEach((value, i) => tr.append(el("td", { "data-label": columns[i], class: row.cls && row.cls[i] }, value)));
      body.append(tr);
    }
    return el("div", { class: "scroll" }, el("table", { class: "cards", "aria-label": label }, head, body));
  }

  function fields(entries) {
    const dl = el("dl", { class: "fields" });
    for (const [k, v] of entries) {
      if (v === null || v === undefined || v === "") continue;
      dl.append(el("dt", { text: k }), el("dd", {}, v));
    }
    return dl;
  }

  // --- time and durations ---------------------------------------------------------------------------
  function absTime(ms) {
    const d = new Date(ms);
    if (utc) return d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
    return d.toLocaleString(lang === "zh" ? "zh-CN" : undefined, { hour12: false });
  }

  // A fire's wall time in the task's own zone, when that is not what the viewer already sees.
  function zoneTime(task, i) {
    const local = (task.next_fires_local || [])[i];
    if (!local || (utc && task.tz === "UTC")) return null;
    return el("span", { class: "muted zone-time", text: " · " + local.slice(0, 16).replace("T", " ") + " " + task.tz });
  }

  function relTime(ms) {
    const diff = ms - Date.now();
    const abs = Math.abs(diff);
    const rtf = new Intl.RelativeTimeFormat(lang === "zh" ? "zh-CN" : "en", { numeric: "auto" });
    const units = [["day", 86400e3], ["hour", 3600e3], ["minute", 60e3], ["second", 1e3]];
    for (const [unit, size] of units) {
      if (abs >= size || unit === "second") return rtf.format(Math.round(diff / size), unit);
    }
    return "";
  }

  function when(ms) {
    if (typeof ms !== "number" || ms <= 0) return "";
    return el("time", { datetime: new Date(ms).toISOString(), title: absTime(ms) },
      absTime(ms), el("span", { class: "muted", text: " · " + relTime(ms) }));
  }

  // compact, for list columns: the relative time, the absolute one as a tooltip
  function whenRel(ms) {
    if (typeof ms !== "number" || ms <= 0) return "";
    return el("time", { datetime: new Date(ms).toISOString(), title: absTime(ms), text: relTime(ms) });
  }

  // Durations as the CLI takes them (docs/tasks.md "Durations"): 90, 2.5, 90s, 5m, 1h30m, 2d, 500ms.
  const DURATION_UNITS = { w: 604800e3, d: 86400e3, h: 3600e3, m: 60e3, s: 1e3, ms: 1 };
  function parseDuration(text) {
    const s = String(text).trim().replace(/([a-z])\s+/g, "$1");
    if (/^\d+(\.\d+)?$/.test(s)) return Math.round(Number(s) * 1000);
    const order = Object.keys(DURATION_UNITS), re = /(\d+(?:\.\d+)?)(ms|[wdhms])/y;
    let total = 0, last = -1, m;
    while ((m = re.exec(s)) !== null) {
      const unit = order.indexOf(m[2]);
      if (unit <= last) return NaN;
      total += Number(m[1]) * DURATION_UNITS[m[2]];
      last = unit;
      if (re.lastIndex === s.length) return Math.round(total);
    }
    return NaN;
  }

  function durationInput(ms) {
    if (typeof ms !== "number") return "";
    if (ms % 1000) return String(ms / 1000);
    const parts = [];
    let rest = ms / 1000;
    for (const [unit, size] of [["h", 3600], ["m", 60], ["s", 1]]) {
      if (rest >= size) { parts.push(Math.floor(rest / size) + unit); rest %= size; }
    }
    return parts.join("") || "0";
  }

  function duration(ms) {
    if (typeof ms !== "number" || ms < 0) return "";
    if (ms < 1000) return ms + " ms";
    const s = ms / 1000;
    if (s < 60) return s.toFixed(1) + " s";
    const m = Math.floor(s / 60), h = Math.floor(m / 60), d = Math.floor(h / 24);
    if (d > 0) return d + "d " + (h % 24) + "h";
    if (h > 0) return h + "h " + String(m % 60).padStart(2, "0") + "m";
    return m + "m " + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  }

  function runDuration(run) {
    if (!run.started_at_ms) return "";
    return duration((run.finished_at_ms || Date.now()) - run.started_at_ms);
  }

  function seconds(ms) { return typeof ms === "number" ? duration(ms) : t("none"); }

  // --- the API --------------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, code, message, details) {
      super(code + ": " + message);
      this.status = status;
      this.code = code;
      this.details = details || {};
    }
  }

  function token() { return session.getItem(TOKEN_KEY) || ""; }
  // A console session (a name and password sign-in): the cookie is HttpOnly; its CSRF token is kept in
  // memory only and read again from GET /session in a new tab. SESSION_HINT says one may exist.
  const SESSION_HINT = "ql3.cookie-session";
  const cookie = { csrf: "", id: null };
  function signedIn() { return Boolean(token() || cookie.csrf); }
  function project() { return session.getItem(PROJECT_KEY) || "default"; }
  function pp(rest) { return "/projects/" + enc(project()) + rest; }

  async function request(method, path, body, raw, csrf) {
    const headers = token() ? { "Authorization": "Bearer " + token() } : {};
    const csrfToken = csrf || cookie.csrf;
    if (!token() && csrfToken && method !== "GET") headers["X-CSRF-Token"] = csrfToken;
    const init = { method: method, headers: headers, cache: "no-store" };
    if (method !== "GET" && method !== "DELETE") {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body || {});
    }
    let resp;
    try {
      resp = await fetch("/api/v1" + path, init);
    } catch (e) {
      setOffline(true);
      throw new ApiError(0, "network_error", "the server did not answer");
    }
    setOffline(false);
    if (raw && resp.ok) return resp;
    let data = null;
    if (resp.status !== 204) {
      try { data = await resp.json(); } catch (e) { data = null; }
    }
    if (!resp.ok) {
      const err = data && data.error;
      if (resp.status === 401) signedOut();
      if (err && err.code) throw new ApiError(resp.status, String(err.code), String(err.message || ""), err.details);
      throw new ApiError(resp.status, "http_" + resp.status, resp.statusText || "request failed");
    }
    return { status: resp.status, body: data };
  }
  async function get(path) { return (await request("GET", path)).body; }
  async function post(path, body) { return request("POST", path, body); }

  function setOffline(down) {
    $("offline").hidden = !down;
    document.body.classList.toggle("stale", down);
  }

  function say(text, isError) {
    const line = $("status");
    line.textContent = text;
    line.classList.toggle("error", Boolean(isError));
  }
  function fail(e) { say(e instanceof ApiError ? errorText(e) : t("err_client") + ": " + e.message, true); }
  // An API error in the page's language: the code's label when there is one (the server's English
  // message after it in English, the code in Chinese), else the server's message.
  function errorText(e) {
    const key = "err_" + e.code;
    if (!I18N.en[key]) return e.message;
    return lang === "zh" ? t(key) + "（" + e.code + "）" : t(key) + (e.message ? ": " + e.message : "");
  }

  // --- who is signed in, and what the role may do ---------------------------------------------------
  const me = { name: null, principalId: session.getItem(ME_KEY), role: null, projects: [] };

  function can(permission) { return Boolean(me.role && (PERMS[me.role] || []).includes(permission)); }

  function learnPrincipal(id) {
    if (id && !me.principalId) {
      me.principalId = id;
      session.setItem(ME_KEY, id);
    }
  }

  async function loadIdentity() {
    const page = await get("/projects?limit=200");
    me.projects = page.items;
    const select = $("project");
    put(select, ...page.items.map((p) => el("option", { value: p.name, text: p.name })));
    if (!page.items.some((p) => p.name === project()) && page.items.length) session.setItem(PROJECT_KEY, page.items[0].name);
    select.value = project();
    const current = page.items.find((p) => p.name === project());
    me.role = current ? current.role : null;
    try {
      const who = await get("/whoami");
      me.name = who.name;
      learnPrincipal(who.principal_id);
      if (who.roles && who.roles[project()]) me.role = who.roles[project()];
    } catch (e) {
      if (!(e instanceof ApiError) || (e.status !== 404 && e.status !== 405)) throw e;
      me.name = null; // an older server without /whoami: the role from the project list is all we know
    }
    showIdentity();
  }

  function showIdentity() {
    const signed = signedIn();
    $("whoami").textContent = !signed ? "" : me.name ? t("signed_in_as", { name: me.name, role: me.role || "?" })
      : t("signed_in_role", { role: me.role || "?" });
    $("whoami").title = $("whoami").textContent; // cut with an ellipsis in a narrow header
    $("project").title = project();
    $("signout").hidden = !signed;
    $("sessions-link").hidden = !signed || Boolean(token());
  }

  function signedOut() {
    session.removeItem(TOKEN_KEY);
    cookie.csrf = "";
    cookie.id = null;
    prefs.removeItem(SESSION_HINT);
    session.removeItem(ME_KEY);
    me.principalId = null;
    me.role = null;
    me.name = null;
    showIdentity();
  }

  // --- confirmation dialog --------------------------------------------------------------------------
  function confirmAction(message, yesLabel) {
    const dialog = $("confirm");
    $("confirm-text").textContent = message;
    $("confirm-yes").textContent = yesLabel;
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
      dialog.returnValue = "";
      dialog.showModal();
    });
  }

  // --- routing --------------------------------------------------------------------------------------
  let generation = 0; // bumped on every navigation: late answers for an old page are dropped
  let refreshTimer = null;
  let refreshFn = null;
  let cleanup = [];

  function parseHash() {
    const hash = location.hash.replace(/^#\/?/, "");
    const q = hash.indexOf("?");
    const path = q >= 0 ? hash.slice(0, q) : hash;
    const params = new URLSearchParams(q >= 0 ? hash.slice(q + 1) : "");
    return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: params };
  }

  let carryStatus = false; // the next page keeps the status line: an action said something, then moved on
  function go(hash) {
    const before = location.hash;
    location.hash = hash;
    if (location.hash !== before) carryStatus = true;
  }

  function setRefresh(fn) { refreshFn = fn; }

  async function render() {
    generation += 1;
    const mine = generation;
    for (const fn of cleanup) fn();
    cleanup = [];
    refreshFn = null;
    if (!carryStatus) say("");
    carryStatus = false;
    $("top").classList.remove("open");
    $("menu").setAttribute("aria-expanded", "false");
    const view = $("view");
    const { parts, params } = parseHash();
    const page = parts[0] || "overview";
    for (const a of document.querySelectorAll("nav a")) {
      if (a.dataset.page === page) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    }
    if (!signedIn()) { renderSignIn(view); return; }
    put(view, el("p", { class: "muted", text: t("loading") }));
    const pages = {
      overview: () => pageOverview(view, mine),
      tasks: () => parts[1] === "new" ? pageTaskForm(view, mine, null, params.get("from"))
        : parts[1] && parts[2] === "edit" ? pageTaskForm(view, mine, parts[1], null)
          : parts[1] ? pageTask(view, mine, parts[1]) : pageTasks(view, mine, params),
      runs: () => parts[1] ? pageRun(view, mine, parts[1]) : pageRuns(view, mine, params),
      approvals: () => pageApprovals(view, mine),
      actions: () => parts[1] ? pageAction(view, mine, parts[1]) : pageActions(view, mine),
      cancellations: () => pageCancellations(view, mine),
      workers: () => pageWorkers(view, mine),
      tokens: () => pageTokens(view, mine),
      deps: () => pageDeps(view, mine),
      variables: () => pageVariables(view, mine),
      scripts: () => parts[1] ? pageScript(view, mine, parts[1], params) : pageScripts(view, mine),
      subscriptions: () => pageSubscriptions(view, mine),
      sessions: () => pageSessions(view, mine),
    };
    for (const [name, fn] of Object.entries(extensionPages)) pages[name] = () => fn(view, mine, parts, params);
    try {
      if (!me.role) await loadIdentity();
      if (mine !== generation) return;
      if (!pages[page]) { put(view, el("h1", { text: t("page_missing") })); return; }
      await pages[page]();
      refreshBadge();
    } catch (e) {
      if (mine !== generation) return;
      if (e instanceof ApiError && e.status === 404) put(view, el("h1", { text: t("not_found") }));
      else if (!signedIn()) renderSignIn(view);
      fail(e);
    }
  }

  function current(mine) { return mine === generation; }

  async function tick() {
    if (!refreshFn || !signedIn() || document.hidden) return;
    const mine = generation;
    try {
      await refreshFn();
      if (current(mine)) await refreshBadge();
    } catch (e) {
      if (current(mine) && !(e instanceof ApiError && e.code === "network_error")) fail(e);
    }
  }

  async function refreshBadge() {
    if (!signedIn()) return;
    const page = await get(pp("/approvals?state=pending&limit=100"));
    const n = page.items.length;
    const b = $("approvals-badge");
    b.hidden = n === 0;
    b.textContent = n >= 100 ? "99+" : String(n);
    b.setAttribute("aria-label", n + " " + t("pending_approvals"));
  }

  // --- sign in --------------------------------------------------------------------------------------
  // Two ways in: a name and password (a cookie session), or a bearer token kept for this tab.
  function renderSignIn(view) {
    const byPassword = passwordSignIn(view);
    put(view, byPassword, tokenSignIn(view));
    byPassword.querySelector("input").focus();
  }

  function tokenSignIn(view) {
    const input = el("input", { id: "signin-token", type: "password", autocomplete: "off", required: true,
      "aria-describedby": "signin-hint" });
    const form = el("form", { class: "panel signin", "aria-label": t("use_token") },
      el("h2", { text: t("use_token") }),
      el("label", {}, t("token"), input),
      el("p", { id: "signin-hint", class: "muted", text: t("sign_in_hint") }),
      el("p", { class: "actions" }, el("button", { type: "submit", class: "primary", text: t("sign_in") })));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      session.setItem(TOKEN_KEY, input.value.trim());
      session.removeItem(ME_KEY);
      me.principalId = null;
      me.role = null;
      try {
        await loadIdentity();
        say("");
        render();
      } catch (e) {
        fail(e);
        input.focus(); // the value stays, so a typo can be fixed
      }
    });
    return form;
  }

  // --- sign-in with a name and password; the session page (docs/security.md "Console sign-in") ------
  function startCookieSession(body) {
    cookie.csrf = body.csrf_token;
    cookie.id = body.session ? body.session.id : null;
    prefs.setItem(SESSION_HINT, "1");
    session.removeItem(TOKEN_KEY);
    learnPrincipal(body.principal_id);
  }

  // A new tab or a restarted browser: the cookie is still there; learn its CSRF token (a hint among
  // the kept preferences, "1" and never a secret, says one may exist, so a signed-out page asks nothing).
  async function resumeSession() {
    if (token() || !prefs.getItem(SESSION_HINT)) return;
    try {
      startCookieSession(await get("/session"));
    } catch (e) {
      signedOut();
    }
  }

  function passwordSignIn(view) {
    const name = el("input", { id: "signin-name", name: "username", autocomplete: "username", required: true, maxlength: 128 });
    const password = el("input", { id: "signin-password", name: "password", type: "password", autocomplete: "current-password",
      required: true, maxlength: 1024, "aria-describedby": "signin-pw-hint" });
    const code = el("input", { id: "signin-totp", name: "totp", autocomplete: "one-time-code", inputmode: "numeric",
      maxlength: 8, pattern: "[0-9]{6}" });
    const codeRow = el("label", { hidden: true }, t("totp_code"), code);
    const form = el("form", { class: "panel signin-pw", "aria-label": t("sign_in") },
      el("h1", { text: t("sign_in") }),
      el("label", {}, t("user_name"), name),
      el("label", {}, t("password"), password),
      codeRow,
      el("p", { id: "signin-pw-hint", class: "muted", text: t("sign_in_pw_hint") }),
      el("p", { class: "actions" }, el("button", { type: "submit", class: "primary", id: "signin-submit", text: t("sign_in") })));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const body = { name: name.value.trim(), password: password.value };
      if (!codeRow.hidden && code.value.trim()) body.totp = code.value.trim();
      try {
        const res = await post("/session", body);
        startCookieSession(res.body);
        me.role = null;
        await loadIdentity();
        say("");
        render();
      } catch (e) {
        if (e instanceof ApiError && e.code === "totp_required") {
          codeRow.hidden = false;
          code.required = true;
          say(t("totp_needed"));
          code.focus();
          return;
        }
        fail(e);
        password.value = "";
        password.focus();
      }
    });
    return form;
  }

  async function pageSessions(view, mine) {
    const page = await get("/sessions");
    if (!current(mine)) return;
    const holder = el("div", { id: "sessions" });
    const draw = (items) => put(holder, table([t("created"), t("last_used"), t("idle_end"), t("session_end"), t("client"),
      t("browser"), t("actions")],
      items.map((x) => ({
        id: x.id,
        cells: [
          when(x.created_at_ms), when(x.last_seen_at_ms), when(x.idle_expires_at_ms), when(x.expires_at_ms), x.client,
          el("span", { class: "muted", title: x.user_agent, text: x.user_agent.slice(0, 40) }),
          el("span", {}, x.current ? badge("enabled", t("this_session")) : "", " ", btn(t("revoke"), async () => {
            if (!(await confirmAction(t("revoke_session_confirm"), t("revoke")))) return;
            try {
              await post("/sessions/" + enc(x.id) + "/revoke");
              if (x.current) { signedOut(); go("#/"); render(); return; }
              draw((await get("/sessions")).items);
            } catch (e) { fail(e); }
          }, "danger")),
        ],
      })), t("no_sessions"), t("nav_sessions")));
    draw(page.items);
    put(view, el("h1", { text: t("nav_sessions") }), el("p", { class: "muted", text: t("sessions_intro") }), holder);
  }

  // --- overview -------------------------------------------------------------------------------------
  async function pageOverview(view, mine) {
    const since = Date.now() - RANGES["24h"];
    const [running, failed, taskPage, pending, workers, health, actions, parked] = await Promise.all([
      get(pp("/runs?status=running,dispatching&limit=20")),
      get(pp("/runs?status=failed,timed_out&since=" + Math.floor(since) + "&limit=20")),
      get(pp("/next-fires?limit=6")),
      get(pp("/approvals?state=pending&limit=100")),
      get(pp("/workers")),
      get(pp("/cancellation/summary")),
      get(pp("/actions?limit=100")),
      get(pp("/parked-items?limit=50")),
    ]);
    if (!current(mine)) return;
    const runList = (items, emptyKey) => items.length === 0 ? el("p", { class: "muted", text: t(emptyKey) })
      : el("ul", {}, items.slice(0, 8).map((r) => el("li", {}, link("#/runs/" + enc(r.id), r.task_name || short(r.task_id)),
        " ", vbadge("status", r.status), " ", el("span", { class: "muted", text: relTime(r.created_at_ms) }))));
    const fires = taskPage.items; // soonest first, enabled tasks only (GET /next-fires)
    const slots = workers.items.reduce((n, w) => n + (w.slots ?? w.max_concurrent_runs ?? 0), 0);
    const busy = workers.items.reduce((n, w) => n + (w.busy ?? w.active_runs ?? 0), 0);
    const online = workers.items.filter((w) => w.status === "online").length;
    const cards = [
      el("section", { "aria-labelledby": "ov-running" }, el("h2", { id: "ov-running", text: t("running_now") }),
        el("div", { class: "stat", text: running.items.length }), runList(running.items, "nothing_running")),
      el("section", { "aria-labelledby": "ov-failed" }, el("h2", { id: "ov-failed" }, link("#/runs?status=failed,timed_out&range=24h", t("failed_24h"))),
        el("div", { class: "stat", text: failed.items.length + (failed.next_cursor ? "+" : "") }), runList(failed.items, "no_failures")),
      el("section", { "aria-labelledby": "ov-fires" }, el("h2", { id: "ov-fires", text: t("next_fires") }),
        fires.length === 0 ? el("p", { class: "muted", text: t("no_cron") })
          : el("ul", {}, fires.map((x) => el("li", {}, link("#/tasks/" + enc(x.task_name), x.task_name), " ", when(x.next_fire_at_ms))))),
      el("section", { "aria-labelledby": "ov-approvals" }, el("h2", { id: "ov-approvals" }, link("#/approvals", t("pending_approvals"))),
        el("div", { class: "stat", text: pending.items.length }),
        pending.items.length === 0 ? el("p", { class: "muted", text: t("no_pending") }) : null),
      el("section", { "aria-labelledby": "ov-capacity" }, el("h2", { id: "ov-capacity" }, link("#/workers", t("capacity"))),
        workers.items.length === 0 ? el("p", { class: "muted", text: t("no_workers") })
          : [el("div", { class: "stat", text: busy + " / " + slots }), el("p", { class: "muted", text: t("slots_busy", { busy: busy, slots: slots, online: online }) })]),
    ];
    // approved actions whose outcome could not be proven wait for a person (newest 100 looked at)
    const stuck = actions.items.filter((a) => a.effective_status === "recovery_required");
    if (stuck.length) {
      cards.push(el("section", { "aria-labelledby": "ov-actions", class: "attention" },
        el("h2", { id: "ov-actions" }, link("#/actions", t("needs_person"))),
        el("div", { class: "stat", text: stuck.length }),
        el("p", { text: t("recovery_required_n", { n: stuck.length }) }),
        el("ul", {}, stuck.slice(0, 5).map((a) => el("li", {}, link("#/actions/" + enc(a.dispatch_id), short(a.dispatch_id), "mono"))))));
    }
    // items a control loop parked (docs/operations.md "Parked items"): loop, kind, id and reason code only
    if (parked.items.length) {
      cards.push(el("section", { "aria-labelledby": "ov-parked", class: "attention" },
        el("h2", { id: "ov-parked", text: t("parked_items") }),
        el("div", { class: "stat", text: parked.items.length + (parked.truncated ? "+" : "") }),
        el("p", { text: t("parked_n", { n: parked.items.length }) }),
        el("ul", {}, parked.items.slice(0, 5).map((p) => el("li", {},
          el("span", { class: "mono", text: p.loop + " · " + p.item_kind + " " + short(p.item_key) }), " ",
          el("code", { text: p.reason }), " ", el("span", { class: "muted", text: "×" + p.failures + " " + relTime(p.last_failed_at_ms) }), " ",
          can("run.stop") ? btn(t("retry_now"), () => post(pp("/parked-items/" + enc(p.item_kind) + "/" + enc(p.item_key) + "/retry"))
            .then(() => { say(t("retried", { kind: p.item_kind, id: short(p.item_key) })); return pageOverview(view, mine); }).catch(fail)) : null)))));
    }
    if (health.assessment !== "clear") {
      cards.push(el("section", { "aria-labelledby": "ov-health", class: "attention" }, el("h2", { id: "ov-health", text: t("health") }),
        vbadge("assessment", health.assessment), el("p", { text: health.operatorAction === "wait" ? t("health_wait") : t("health_inspect") }),
        fields([[t("h_blocked"), health.dispatches.blocked], [t("h_pending"), health.dispatches.pending], [t("h_due"), health.signals.due]]),
        el("p", {}, link("#/cancellations", t("open_blocked")))));
    }
    put(view, el("h1", { text: t("nav_overview") }), el("div", { class: "grid" }, cards), overviewCharts(mine));
    setRefresh(() => pageOverview(view, mine));
  }

  // --- tasks ----------------------------------------------------------------------------------------
  async function startRun(task, rerunOf) {
    const res = await post(pp("/tasks/" + enc(task.id || task.name) + "/runs"), rerunOf ? { rerun_of: rerunOf } : {});
    if (res.status === 202) {
      learnPrincipal(res.body.approval.requested_by);
      say(t("approval_requested", { task: task.name || task.task_name }));
      go("#/approvals");
      return;
    }
    say(t("started_run", { id: short(res.body.id), task: res.body.task_name }));
    go("#/runs/" + enc(res.body.id));
  }

  async function setEnabled(task, enabled) {
    await post(pp("/tasks/" + enc(task.id) + (enabled ? "/enable" : "/disable")));
  }

  async function pageTasks(view, mine, params) {
    const holder = el("div");
    const load = async () => {
      const page = await get(pp(listQuery("/tasks", params, TASK_PAGE)));
      if (!current(mine)) return;
      const rows = page.items.map((task) => ({
        id: task.id,
        cells: [
          link("#/tasks/" + enc(task.name), task.name),
          badge(task.enabled ? "enabled" : "disabled", task.enabled ? t("enabled") : t("disabled")),
          el("code", { text: task.cron || "—" }),
          task.next_fire_at_ms ? when(task.next_fire_at_ms) : "",
          task.approval === "required" ? t("approval") : "",
          el("span", { class: "actions" },
            can("run.create") && task.enabled ? btn(t("run_now"), () => startRun(task).catch(fail), "primary") : null,
            can("task.write") ? btn(task.enabled ? t("disable") : t("enable"),
              () => setEnabled(task, !task.enabled).then(load).catch(fail)) : null),
        ],
      }));
      put(holder, table([t("name"), t("status"), t("cron"), t("next_fire"), t("approval"), t("actions")], rows, t("no_tasks"), t("nav_tasks")),
        pager("#/tasks", params, page));
    };
    await load();
    if (!current(mine)) return;
    put(view,
      el("h1", { text: t("nav_tasks") }),
      can("task.write") ? el("p", { class: "actions" }, link("#/tasks/new", t("new_task"), "button primary")) : null,
      el("section", {}, searchBox("#/tasks", params, t("search_tasks"))),
      el("section", {}, holder));
    setRefresh(load); // only the list: a half-typed search stays as it is
  }

  const SPEC_FIELDS = ["command", "cwd", "cron", "env_keys", "timeout_ms", "grace_ms", "require", "prefer",
    "overlap", "misfire", "approval", "max_attempts", "environment_policy", "has_cwd"];

  function show(v) {
    if (v === null || v === undefined) return "—";
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  // What changed between two revisions' public specs: [{key, from, to}].
  function specDiff(older, newer) {
    const out = [];
    for (const key of SPEC_FIELDS) {
      if (!(key in newer) && !(key in older)) continue;
      const a = show(older[key]), b = show(newer[key]);
      if (a !== b) out.push({ key: key, from: a, to: b });
    }
    return out;
  }

  function diffList(changes) {
    if (changes.length === 0) return el("p", { class: "muted", text: t("no_change") });
    return el("ul", { class: "diff" }, changes.map((c) => el("li", {}, el("code", { text: c.key }), ": ",
      el("del", { text: c.from }), " → ", el("ins", { text: c.to }))));
  }

  function placement(task) {
    const req = Object.entries(task.require || {}).map(([k, v]) => k + "=" + v).join(", ");
    const pref = (task.prefer || []).map((p) => Object.entries(p.labels).map(([k, v]) => k + "=" + v).join(",") + ":" + p.weight).join("; ");
    return [req ? t("p_require") + " " + req : "", pref ? t("p_prefer") + " " + pref : ""].filter(Boolean).join(" · ") || t("none");
  }

  function commandView(task) {
    if (!task.command_visible) return el("span", { class: "muted", text: t("command_hidden") });
    return el("pre", { class: "command", text: task.command });
  }

  function cwdView(task) {
    if (task.command_visible) return task.cwd ? el("code", { text: task.cwd }) : t("cwd_default");
    return task.has_cwd ? t("cwd_set") : t("cwd_default");
  }

  function runsTable(items) {
    return table([t("run"), t("task"), t("status"), t("trigger"), t("attempt"), t("created"), t("started"), t("finished"),
      t("duration"), t("exit")],
      items.map((r) => ({
        id: r.id,
        cells: [
          link("#/runs/" + enc(r.id), short(r.id), "mono"),
          r.task_name ? link("#/tasks/" + enc(r.task_name), r.task_name) : short(r.task_id),
          el("span", {}, vbadge("status", r.status), r.waiting_reason ? el("span", { class: "muted", text: " " + t("waiting", { reason: lbl("waiting", r.waiting_reason) }) }) : null),
          lbl("trigger", r.trigger || r.trigger_type),
          r.attempt ?? "",
          when(r.created_at_ms),
          whenRel(r.started_at_ms),
          whenRel(r.finished_at_ms),
          runDuration(r),
          r.exit_code ?? "",
        ],
      })), t("no_runs"), t("nav_runs"));
  }

  async function pageTask(view, mine, ref) {
    const [task, revisions] = await Promise.all([
      get(pp("/tasks/" + enc(ref))), get(pp("/tasks/" + enc(ref) + "/revisions")),
    ]);
    const history = await get(pp("/runs?task=" + enc(task.id) + "&limit=20"));
    if (!current(mine)) return;
    const last = history.items.find((r) => TERMINAL.has(r.status));
    const revs = revisions.items;
    const actions = el("p", { class: "actions" },
      can("run.create") && task.enabled ? btn(t("run_now"), () => startRun(task).catch(fail), "primary") : null,
      can("task.write") ? link("#/tasks/" + enc(task.name) + "/edit", t("edit"), "button") : null,
      can("task.write") ? link("#/tasks/new?from=" + enc(task.name), t("clone"), "button") : null,
      can("task.write") ? btn(task.enabled ? t("disable") : t("enable"),
        () => setEnabled(task, !task.enabled).then(() => pageTask(view, mine, task.name)).catch(fail)) : null,
      can("task.write") ? btn(t("delete"), async () => {
        if (!(await confirmAction(t("delete_confirm", { name: task.name }), t("delete")))) return;
        try {
          await request("DELETE", pp("/tasks/" + enc(task.id)));
          say(t("deleted", { name: task.name }));
          go("#/tasks");
        } catch (e) { fail(e); }
      }, "danger") : null);
    const revisionItems = revs.map((rev, i) => el("li", {},
      el("strong", { text: "r" + rev.revision }), " ", when(rev.created_at_ms),
      i + 1 < revs.length ? diffList(specDiff(revs[i + 1].spec, rev.spec)) : el("span", { class: "muted", text: " · " + t("first_revision") })));
    put(view, 
      el("h1", {}, task.name, " ", badge(task.enabled ? "enabled" : "disabled", task.enabled ? t("enabled") : t("disabled"))),
      actions,
      el("section", {}, fields([
        [t("command"), commandView(task)],
        [t("cwd"), cwdView(task)],
        [t("env_keys"), task.env_keys.length ? el("code", { text: task.env_keys.join(", ") }) : t("none")],
        [t("revision"), "r" + task.revision],
        [t("cron"), task.cron ? el("span", {}, el("code", { text: task.cron.replace(/^CRON_TZ=\S+\s+/, "") }), " ",
          el("span", { class: "muted", id: "task-tz", text: "(" + task.tz + ")" })) : t("none")],
        [t("next_fire"), (task.next_fires_at_ms || []).length
          ? el("ol", { class: "timeline", id: "next-fires" }, task.next_fires_at_ms.map((ms, i) => el("li", {}, when(ms),
            zoneTime(task, i))))
          : task.next_fire_at_ms ? when(task.next_fire_at_ms) : null],
        [t("timeout"), seconds(task.timeout_ms)],
        [t("grace"), seconds(task.grace_ms)],
        [t("placement"), placement(task)],
        [t("overlap"), lbl("overlap", task.overlap)], [t("misfire"), lbl("misfire", task.misfire)],
        [t("misfire_grace"), task.cron ? seconds(task.misfire_grace_ms) : null],
        [t("random_delay"), task.random_delay_ms ? seconds(task.random_delay_ms) : null],
        [t("on_start"), task.on_start ? t("enabled") : null],
        [t("approval"), lbl("approval_policy", task.approval)],
        [t("max_attempts"), task.max_attempts],
        [t("run_history"), last ? el("span", {}, vbadge("status", last.status), " ", when(last.finished_at_ms || last.created_at_ms)) : null],
      ])),
      runStripSection(task, mine),
      el("section", { "aria-labelledby": "task-runs" }, el("h2", { id: "task-runs" }, link("#/runs?task=" + enc(task.name), t("run_history"))),
        runsTable(history.items)),
      el("section", { "aria-labelledby": "task-skipped" }, el("h2", { id: "task-skipped", text: t("skipped") }),
        (task.skipped_occurrences || []).length
          ? el("ol", { class: "timeline", id: "skipped-occurrences" }, task.skipped_occurrences.map((s) => el("li", {},
            when(s.occurrence_ms), s.occurrences > 1 ? el("span", {}, " … ", when(s.last_occurrence_ms), " (" + s.occurrences + ")") : "",
            " ", badge(s.reason), " r" + s.task_revision)))
          : el("p", { class: "muted", text: t("no_skipped") })),
      el("section", { "aria-labelledby": "task-revs" }, el("h2", { id: "task-revs", text: t("revisions") }),
        el("ol", { class: "timeline" }, revisionItems)));
    setRefresh(() => pageTask(view, mine, task.name));
  }

  function parsePairs(text, sep) {
    const out = {};
    for (const part of text.split(sep)) {
      const s = part.trim();
      if (!s) continue;
      const i = s.indexOf("=");
      if (i <= 0) throw new Error("expected KEY=VALUE: " + s);
      out[s.slice(0, i).trim()] = s.slice(i + 1);
    }
    return out;
  }

  async function pageTaskForm(view, mine, editRef, cloneRef) {
    const base = editRef || cloneRef ? await get(pp("/tasks/" + enc(editRef || cloneRef))) : null;
    if (!current(mine)) return;
    const editing = Boolean(editRef);
    const input = (name, value, attrs) => el("input", Object.assign({ name: name, value: value ?? "" }, attrs || {}));
    const kinds = { overlap: "overlap", misfire: "misfire", approval: "approval_policy" };
    const select = (name, options, value) => el("select", { name: name },
      options.map((o) => el("option", { value: o, text: lbl(kinds[name], o), selected: o === value })));
    const f = {
      name: input("name", cloneRef && base ? base.name + "-copy" : "", { required: true, pattern: "[^\\/\\-\\s][^\\/]*", maxlength: 128 }),
      command: el("textarea", { name: "command", rows: 3, required: true }),
      cron: input("cron", base ? base.cron : "", { placeholder: "0 3 * * *" }),
      cwd: input("cwd", base && base.command_visible ? base.cwd : "", { placeholder: "/srv/app" }),
      env: el("textarea", { name: "env", rows: 2, placeholder: editing ? t("env_keep", { keys: base.env_keys.join(", ") || t("none") }) : "KEY=VALUE" }),
      timeout: input("timeout", base && base.timeout_ms ? durationInput(base.timeout_ms) : "", { placeholder: "1h30m" }),
      grace: input("grace", base ? durationInput(base.grace_ms) : "5s", { placeholder: "5s" }),
      max_attempts: input("max_attempts", base ? base.max_attempts : 1, { type: "number", min: 1, max: 100 }),
      require: input("require", base ? Object.entries(base.require).map(([k, v]) => k + "=" + v).join(",") : "", { placeholder: "zone=eu" }),
      overlap: select("overlap", ["allow", "skip", "cancel_previous"], base ? base.overlap : "allow"),
      misfire: select("misfire", ["skip", "fire_once"], base ? base.misfire : "skip"),
      approval: select("approval", ["none", "required"], base ? base.approval : "none"),
      enabled: el("input", { type: "checkbox", name: "enabled", checked: !base || base.enabled }),
    };
    f.command.value = base && base.command_visible ? base.command : "";
    const label = (key, control, cls) => el("label", { class: cls }, t(key), control);
    const form = el("form", { class: "task", "aria-label": editing ? t("edit") : t("new_task") },
      editing ? null : label("name", f.name),
      label("command", f.command, "wide"),
      label("cron", f.cron), label("cwd", f.cwd),
      label("timeout_s", f.timeout), label("grace_s", f.grace), label("max_attempts", f.max_attempts),
      label("require", f.require), label("overlap", f.overlap), label("misfire", f.misfire), label("approval", f.approval),
      label("env_lines", f.env, "wide"),
      editing ? null : el("label", { class: "check" }, f.enabled, t("enabled")),
      el("p", { class: "actions wide" }, el("button", { type: "submit", class: "primary", text: editing ? t("save") : t("create") }),
        link(editing ? "#/tasks/" + enc(editRef) : "#/tasks", t("cancel_edit"), "button")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const timeout = f.timeout.value.trim() ? parseDuration(f.timeout.value) : null;
        const grace = f.grace.value.trim() ? parseDuration(f.grace.value) : 0;
        for (const [key, v] of [["timeout_s", timeout], ["grace_s", grace]]) {
          if (Number.isNaN(v)) throw new Error(t("bad_duration", { field: t(key) }));
        }
        const spec = {
          command: f.command.value,
          cron: f.cron.value.trim() || null,
          cwd: f.cwd.value.trim() || null,
          timeout_ms: timeout,
          grace_ms: grace,
          max_attempts: Number(f.max_attempts.value || 1),
          require: parsePairs(f.require.value, ","),
          overlap: f.overlap.value, misfire: f.misfire.value, approval: f.approval.value,
        };
        const env = f.env.value.trim() ? parsePairs(f.env.value, "\n") : null;
        if (!editing) {
          const body = { name: f.name.value.trim(), enabled: f.enabled.checked };
          for (const [k, v] of Object.entries(spec)) if (v !== null) body[k] = v;
          if (env) body.env = env;
          const res = await post(pp("/tasks"), body);
          say(t("created_task", { name: res.body.name }));
          go("#/tasks/" + enc(res.body.name));
          return;
        }
        const changes = {};
        const old = { command: base.command, cron: base.cron, cwd: base.cwd, timeout_ms: base.timeout_ms, grace_ms: base.grace_ms,
          max_attempts: base.max_attempts, require: base.require, overlap: base.overlap, misfire: base.misfire, approval: base.approval };
        for (const [k, v] of Object.entries(spec)) if (show(v) !== show(old[k])) changes[k] = v;
        if (env) changes.env = env;
        if (Object.keys(changes).length === 0) { say(t("unchanged")); return; }
        const res = await request("PATCH", pp("/tasks/" + enc(base.id)), changes);
        const revs = (await get(pp("/tasks/" + enc(base.id) + "/revisions"))).items;
        const diff = revs.length > 1 ? specDiff(revs[1].spec, revs[0].spec) : [];
        say(t("published", { rev: res.body.revision, changes: diff.map((c) => c.key).join(", ") || t("no_change") }));
        go("#/tasks/" + enc(res.body.name));
      } catch (e) { fail(e); }
    });
    put(view, el("h1", { text: editing ? t("edit") + " " + base.name : t("new_task") }), el("section", {}, form));
  }

  // --- list paging and search: keyset pages whose state (q, cursor, before) lives in the URL hash ---
  const TASK_PAGE = 50;

  function listHash(base, params, changes) {
    const next = new URLSearchParams(params);
    for (const [key, value] of Object.entries(changes)) { if (value) next.set(key, value); else next.delete(key); }
    const s = next.toString();
    return base + (s ? "?" + s : "");
  }

  function listQuery(path, params, limit) {
    const q = new URLSearchParams({ limit: String(limit) });
    for (const key of ["q", "cursor", "before"]) if (params.get(key)) q.set(key, params.get(key));
    return path + "?" + q.toString();
  }

  function searchBox(base, params, label) {
    const input = el("input", { type: "search", name: "q", value: params.get("q") || "", maxlength: 128, autocomplete: "off" });
    return el("form", { class: "filters search", role: "search", "aria-label": label, onsubmit: (e) => {
      e.preventDefault();
      go(listHash(base, params, { q: input.value.trim(), cursor: null, before: null }));
    } }, el("label", {}, label, input), el("button", { type: "submit", text: t("search") }));
  }

  function pager(base, params, page) {
    const prev = page.prev_cursor ? link(listHash(base, params, { cursor: null, before: page.prev_cursor }), t("prev_page"), "button") : null;
    const next = page.next_cursor ? link(listHash(base, params, { before: null, cursor: page.next_cursor }), t("next_page"), "button") : null;
    return prev || next ? el("nav", { class: "actions pager", "aria-label": t("pages") }, prev, next) : null;
  }

  // A typed task name with suggestions from the server's search, so any of 10,000 tasks can be picked.
  let pickerCount = 0;
  function taskPicker(value, onPick) {
    pickerCount += 1;
    const listId = "task-options-" + pickerCount;
    const options = el("datalist", { id: listId });
    const input = el("input", { type: "search", name: "task", value: value, list: listId, autocomplete: "off",
      maxlength: 128, placeholder: t("any"), title: t("task_picker_hint") });
    let asked = 0;
    input.addEventListener("input", async () => {
      const mine = ++asked;
      const typed = input.value.trim();
      try {
        const page = await get(pp("/tasks?limit=20" + (typed ? "&q=" + enc(typed) : "")));
        if (mine !== asked) return;
        put(options, page.items.map((x) => el("option", { value: x.name })));
      } catch (e) { fail(e); }
    });
    input.addEventListener("change", () => onPick(input.value.trim()));
    return [input, options];
  }

  // --- runs -----------------------------------------------------------------------------------------
  function runQuery(params, cursor) {
    const q = new URLSearchParams();
    for (const key of ["status", "task", "trigger"]) if (params.get(key)) q.set(key, params.get(key));
    const range = params.get("range");
    if (range && RANGES[range]) q.set("since", String(Math.floor(Date.now() - RANGES[range])));
    for (const key of ["since", "until"]) {
      const v = params.get(key);
      if (v && !range) { const ms = Date.parse(v); if (!Number.isNaN(ms)) q.set(key, String(ms)); }
    }
    q.set("limit", "50");
    if (cursor) q.set("cursor", cursor);
    return "/runs?" + q.toString();
  }

  async function pageRuns(view, mine, params) {
    const setParam = (key, value) => {
      const next = new URLSearchParams(params);
      if (value) next.set(key, value); else next.delete(key);
      if (key === "range" && value !== "custom") { next.delete("since"); next.delete("until"); }
      go("#/runs" + (next.toString() ? "?" + next.toString() : ""));
    };
    const opt = (value, label, selected) => el("option", { value: value, text: label, selected: selected });
    const statusSel = el("select", { name: "status", "aria-label": t("status"), onchange: (e) => setParam("status", e.target.value) },
      opt("", t("any")), opt("failed,timed_out", t("failed_or_timed_out"), params.get("status") === "failed,timed_out"),
      STATUSES.map((s) => opt(s, lbl("status", s), params.get("status") === s)));
    const taskSel = taskPicker(params.get("task") || "", (name) => setParam("task", name));
    const triggerSel = el("select", { name: "trigger", "aria-label": t("trigger"), onchange: (e) => setParam("trigger", e.target.value) },
      opt("", t("any")), TRIGGERS.map((x) => opt(x, lbl("trigger", x), params.get("trigger") === x)));
    const range = params.get("range") || "";
    const rangeSel = el("select", { name: "range", "aria-label": t("time_range"), onchange: (e) => setParam("range", e.target.value) },
      opt("", t("any")), Object.keys(RANGES).map((r) => opt(r, t("last", { range: r }), range === r)), opt("custom", t("custom"), range === "custom"));
    const custom = range === "custom" ? [
      el("label", {}, t("since"), el("input", { type: "datetime-local", name: "since", value: params.get("since") || "", onchange: (e) => setParam("since", e.target.value) })),
      el("label", {}, t("until"), el("input", { type: "datetime-local", name: "until", value: params.get("until") || "", onchange: (e) => setParam("until", e.target.value) })),
    ] : [];
    const filters = el("form", { class: "filters", "aria-label": t("filters"), onsubmit: (e) => e.preventDefault() },
      el("label", {}, t("status"), statusSel), el("label", {}, t("task"), taskSel), el("label", {}, t("trigger"), triggerSel),
      el("label", {}, t("time_range"), rangeSel), custom);
    const holder = el("div");
    const more = btn(t("older"), () => loadMore().catch(fail));
    const state = { cursors: [null], items: [], next: null };
    const draw = () => {
      put(holder, runsTable(state.items));
      more.hidden = !state.next;
    };
    // Auto-refresh re-reads every page already shown (each from its own cursor), so loading older runs
    // does not freeze the list; rows are de-duplicated by id across page boundaries.
    const reload = async () => {
      const seen = new Set();
      const items = [];
      let next = null;
      const cursors = state.cursors.slice(0, MAX_REFRESH_PAGES);
      for (const cursor of cursors) {
        const page = await get(pp(runQuery(params, cursor)));
        for (const r of page.items) if (!seen.has(r.id)) { seen.add(r.id); items.push(r); }
        next = page.next_cursor;
      }
      if (!current(mine)) return;
      state.items = items;
      state.next = next;
      draw();
    };
    const loadMore = async () => {
      if (!state.next) return;
      const page = await get(pp(runQuery(params, state.next)));
      if (!current(mine)) return;
      state.cursors.push(state.next);
      const seen = new Set(state.items.map((r) => r.id));
      for (const r of page.items) if (!seen.has(r.id)) state.items.push(r);
      state.next = page.next_cursor;
      draw();
    };
    await reload();
    if (!current(mine)) return;
    put(view, el("h1", { text: t("nav_runs") }), el("section", {}, filters), el("section", {}, holder, el("p", { class: "actions" }, more)));
    setRefresh(reload);
  }

  // ANSI SGR colours into spans; any other escape or control sequence is dropped.
  const ESCAPES = /\x1b\[([0-9;]*)m|\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/g;
  const PARTIAL = /\x1b(\[[0-9;?]*[ -/]*|\][^\x07\x1b]*)?$/;

  class AnsiLog {
    constructor() { this.segments = []; this.size = 0; this.carry = ""; this.style = {}; }
    cls() {
      const s = this.style, out = [];
      if (s.bold) out.push("ansi-bold");
      if (s.dim) out.push("ansi-dim");
      if (s.italic) out.push("ansi-italic");
      if (s.underline) out.push("ansi-underline");
      if (s.fg) out.push("ansi-fg-" + s.fg);
      if (s.bg) out.push("ansi-bg-" + s.bg);
      return out.join(" ");
    }
    sgr(params) {
      const codes = params === "" ? [0] : params.split(";").map((x) => Number(x) || 0);
      for (let i = 0; i < codes.length; i++) {
        const c = codes[i];
        if (c === 0) this.style = {};
        else if (c === 1) this.style.bold = true;
        else if (c === 2) this.style.dim = true;
        else if (c === 3) this.style.italic = true;
        else if (c === 4) this.style.underline = true;
        else if (c === 22) { this.style.bold = false; this.style.dim = false; }
        else if (c === 23) this.style.italic = false;
        else if (c === 24) this.style.underline = false;
        else if ((c >= 30 && c <= 37) || (c >= 90 && c <= 97)) this.style.fg = c;
        else if (c === 39) this.style.fg = null;
        else if (c >= 40 && c <= 47) this.style.bg = c;
        else if (c === 49) this.style.bg = null;
        else if (c === 38 || c === 48) i += codes[i + 1] === 5 ? 2 : 4; // 256/true colour: not rendered
      }
    }
    push(text, cls) {
      if (!text) return;
      const last = this.segments[this.segments.length - 1];
      if (last && last.cls === cls) last.text += text; else this.segments.push({ text: text, cls: cls });
      this.size += text.length;
      while (this.size > MAX_LOG_CHARS && this.segments.length) {
        const first = this.segments[0];
        const drop = Math.min(first.text.length, this.size - MAX_LOG_CHARS);
        first.text = first.text.slice(drop);
        this.size -= drop;
        if (!first.text) this.segments.shift();
      }
    }
    write(data, final) {
      let text = this.carry + data;
      this.carry = "";
      const partial = final ? null : PARTIAL.exec(text);
      if (partial && partial[0]) { this.carry = partial[0]; text = text.slice(0, partial.index); }
      let at = 0;
      const start = this.segments.length;
      ESCAPES.lastIndex = 0;
      for (let m = ESCAPES.exec(text); m; m = ESCAPES.exec(text)) {
        this.push(text.slice(at, m.index), this.cls());
        if (m[1] !== undefined) this.sgr(m[1]);
        at = m.index + m[0].length;
      }
      this.push(text.slice(at), this.cls());
      return start;
    }
    plain() { return this.segments.map((s) => s.text).join(""); }
  }

  async function downloadLog(run) {
    const resp = await request("GET", pp("/runs/" + enc(run.id) + "/logs/raw"), null, true);
    const blob = await resp.blob();
    const url = URL.createObjectURL(blob);
    const a = el("a", { href: url, download: "run-" + run.id + ".log" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  // --- the run page's log view (docs/console.md "The run log"): it opens at the end of the log with one
  // ranged read, loads earlier pages as it is scrolled up (later ones as it is scrolled down), jumps to
  // the start or the end with one read, and finds text with the server's search over the whole log,
  // loading the region around each match. At most LOG_WINDOW characters are kept; live tailing appends
  // while the view holds the end of the log.
  const LOG_RANGE = 262144; // bytes of one ranged read (the API's largest page)
  const LOG_WINDOW = MAX_LOG_CHARS; // characters kept in view (AnsiLog never trims below this)
  const LOG_SEARCH_CALLS = 32; // search requests one step makes at most (each scans at most 8 MiB)
  const LOG_EDGE_PX = 48; // how near the top or bottom a scroll loads the next page

  function byteSize(n) {
    if (n < 1024) return n + " B";
    if (n < 1048576) return (n / 1024).toFixed(1) + " KiB";
    return (n / 1048576).toFixed(1) + " MiB";
  }

  function logView(runId, mine, pre, ui) {
    const base = pp("/runs/" + enc(runId) + "/logs");
    const st = { pages: [], lo: 0, hi: 0, size: 0, atEnd: false, complete: false, attempt: null, busy: false,
      query: "", match: null, matchLen: 0 };
    const att = () => (st.attempt ? "&attempt=" + st.attempt : "");
    const read = async (params) => {
      const page = await get(base + "?" + params + att());
      if (st.attempt === null && page.attempt !== null) st.attempt = page.attempt;
      st.size = Math.max(page.size, page.next_offset);
      return page;
    };
    const chars = () => st.pages.reduce((n, p) => n + p.text.length, 0);
    const reset = (page) => {
      st.pages = [{ off: page.offset, end: page.next_offset, text: page.data }];
      st.lo = page.offset; st.hi = page.next_offset; st.atEnd = page.eof; st.complete = page.complete;
    };
    const nearBottom = () => pre.scrollHeight - pre.scrollTop - pre.clientHeight < LOG_EDGE_PX;
    const render = () => {
      const raw = st.pages.map((p) => p.text).join("");
      const log = new AnsiLog();
      log.write(raw, st.complete);
      const needle = ui.search.value ? ui.search.value.toLowerCase() : "";
      // the loaded match the server found: its place in the text as shown (escapes stripped)
      let want = -1;
      if (st.match !== null && st.match >= st.lo && st.match < st.hi) {
        const before = raw.slice(0, utf8Index(raw, st.match - st.lo));
        want = before.replace(ESCAPES, "").length;
      }
      const frag = document.createDocumentFragment();
      let count = 0, pos = 0, best = null, bestGap = Infinity;
      for (const seg of log.segments) {
        const span = el("span", { class: seg.cls || null });
        if (!needle) span.textContent = seg.text;
        else {
          const lower = seg.text.toLowerCase();
          let at = 0;
          for (let i = lower.indexOf(needle); i >= 0; i = lower.indexOf(needle, i + needle.length)) {
            const mark = el("mark", { text: seg.text.slice(i, i + needle.length) });
            span.append(seg.text.slice(at, i), mark);
            if (want >= 0 && Math.abs(pos + i - want) < bestGap) { best = mark; bestGap = Math.abs(pos + i - want); }
            at = i + needle.length;
            count++;
          }
          span.append(seg.text.slice(at));
        }
        pos += seg.text.length;
        frag.append(span);
      }
      put(pre, frag);
      if (!log.segments.length) pre.textContent = st.lo > 0 || !st.atEnd ? "" : t("log_empty");
      if (best) best.classList.add("current");
      ui.matchInfo.textContent = needle ? t("matches", { n: count }) + (st.match !== null ? " · " + t("log_match_at",
        { at: byteSize(st.match), size: byteSize(st.size) }) : "") : "";
      ui.range.textContent = st.size ? t("log_range", { from: byteSize(st.lo), to: byteSize(st.hi), size: byteSize(st.size) }) : "";
      return best;
    };
    const trimFront = () => { // live tailing or reading on: drop the oldest pages past the window
      let dropped = false;
      while (st.pages.length > 1 && chars() > LOG_WINDOW) { st.pages.shift(); dropped = true; }
      if (st.pages.length) st.lo = st.pages[0].off;
      return dropped;
    };
    const append = (page) => {
      if (page.data) st.pages.push({ off: page.offset, end: page.next_offset, text: page.data });
      st.hi = page.next_offset; st.atEnd = page.eof; st.complete = page.complete;
    };
    const guarded = async (work) => {
      if (st.busy) return;
      st.busy = true;
      try { await work(); } catch (e) { fail(e); } finally { st.busy = false; }
    };
    const view = {
      state: st,
      redraw: () => render(),
      // open at the end: one read of the last LOG_RANGE bytes
      toEnd: () => guarded(async () => {
        const page = await read("from_end=" + LOG_RANGE);
        if (!current(mine)) return;
        st.match = null;
        reset(page);
        render();
        pre.scrollTop = pre.scrollHeight;
        if (st.lo > 0 && pre.scrollHeight <= pre.clientHeight) await view.earlierNow();
      }),
      toStart: () => guarded(async () => {
        const page = await read("offset=0&max_bytes=" + LOG_RANGE);
        if (!current(mine)) return;
        st.match = null;
        reset(page);
        render();
        pre.scrollTop = 0;
      }),
      earlierNow: async () => {
        if (st.lo <= 0) return;
        const page = await read("before=" + st.lo + "&max_bytes=" + LOG_RANGE);
        if (!current(mine) || page.next_offset > st.lo || page.offset >= st.lo) return;
        const height = pre.scrollHeight, top = pre.scrollTop;
        st.pages.unshift({ off: page.offset, end: page.next_offset, text: page.data });
        st.lo = page.offset;
        while (st.pages.length > 1 && chars() > LOG_WINDOW) { st.pages.pop(); st.atEnd = false; st.complete = false; }
        st.hi = st.pages[st.pages.length - 1].end;
        render();
        pre.scrollTop = top + (pre.scrollHeight - height); // the lines in view stay in view
      },
      earlier: () => guarded(() => view.earlierNow()),
      later: () => guarded(async () => {
        if (st.atEnd) return;
        const page = await read("offset=" + st.hi + "&max_bytes=" + LOG_RANGE);
        if (!current(mine)) return;
        append(page);
        const height = (render(), pre.scrollHeight), top = pre.scrollTop;
        if (trimFront()) { render(); pre.scrollTop = top - (height - pre.scrollHeight); }
      }),
      // live tailing (the poll loop): follow the end while the view holds it
      tail: async (follow) => {
        if (st.busy) return;
        if (!st.atEnd) { // reading elsewhere: only learn whether the log is whole yet
          const page = await read("from_end=1");
          if (current(mine)) st.complete = page.complete;
          return;
        }
        const stick = follow && nearBottom();
        let grew = false;
        for (let i = 0; i < 16; i++) { // bounded catch-up per poll: 16 pages of 64 KiB
          const page = await read("offset=" + st.hi + "&max_bytes=" + LOG_PAGE);
          if (!current(mine) || !st.atEnd) return;
          if (page.data) grew = true;
          const was = st.complete;
          append(page);
          if (page.eof) { if (was !== st.complete) grew = true; break; }
        }
        if (!grew && st.pages.length) return;
        const top = pre.scrollTop, height = pre.scrollHeight;
        render();
        if (trimFront()) { render(); if (!stick) pre.scrollTop = top - (height - pre.scrollHeight); }
        if (stick) pre.scrollTop = pre.scrollHeight;
      },
      // the next (dir 1) or previous (dir -1) match of the search text in the whole log
      find: (dir) => {
        if (ui.search.value) ui.reading(); // at once: the follow must not move the view while the search runs
        return view.findNow(dir);
      },
      findNow: (dir) => guarded(async () => {
        const q = ui.search.value;
        if (!q) return;
        if (q !== st.query) { st.query = q; st.match = null; }
        let cursor = dir > 0 ? (st.match === null ? 0 : st.match + 1) : (st.match === null ? st.size : st.match);
        ui.matchInfo.textContent = t("log_searching");
        for (let i = 0; i < LOG_SEARCH_CALLS; i++) {
          const res = await get(base + "/search?q=" + encodeURIComponent(q) + (dir > 0 ? "&after=" : "&before=") + cursor + "&limit=1" + att());
          if (!current(mine) || ui.search.value !== q) return;
          st.size = Math.max(st.size, res.size);
          if (res.matches.length) { await showMatch(res.matches[0].offset, res.matches[0].length); return; }
          if (res.next_cursor === null) break;
          cursor = res.next_cursor;
        }
        ui.matchInfo.textContent = t(st.match === null ? "log_no_match" : "log_no_more");
      }),
    };
    const showMatch = async (at, length) => {
      st.match = at; st.matchLen = length;
      ui.reading();
      if (!(at >= st.lo && at + length <= st.hi)) {
        // load the region around the match: the page that ends half a read past it
        const page = await read("before=" + (at + length + LOG_RANGE / 2) + "&max_bytes=" + LOG_RANGE);
        if (!current(mine)) return;
        reset(page);
      }
      const mark = render();
      if (mark) mark.scrollIntoView({ block: "center" });
    };
    pre.addEventListener("scroll", () => {
      if (st.busy) return;
      if (pre.scrollTop < LOG_EDGE_PX && st.lo > 0) view.earlier();
      else if (!st.atEnd && nearBottom()) view.later();
    });
    return view;
  }

  // The index in `text` of the character at UTF-8 byte `bytes` of it.
  function utf8Index(text, bytes) {
    let b = 0;
    for (let i = 0; i < text.length; i++) {
      if (b >= bytes) return i;
      const c = text.charCodeAt(i);
      if (c < 0x80) b += 1;
      else if (c < 0x800) b += 2;
      else if (c >= 0xd800 && c <= 0xdbff) { b += 4; i++; }
      else b += 3;
    }
    return text.length;
  }

  function eventLine(ev) {
    const p = ev.payload || {};
    const bits = [];
    if (p.from && p.to) bits.push(lbl("status", p.from) + " → " + lbl("status", p.to));
    const valueKind = { reason: "cancel_reason", result: "result", outcome: "outcome", trigger_type: "trigger" };
    for (const key of ["attempt", "exit_code", "error_code", "reason", "result", "outcome", "trigger_type", "task_revision"]) {
      if (p[key] !== undefined && p[key] !== null) bits.push(lbl("event_key", key) + "=" + (valueKind[key] ? lbl(valueKind[key], p[key]) : p[key]));
    }
    return el("li", { "data-type": ev.type }, el("strong", { class: "event-type", title: ev.type, text: lbl("event", ev.type) }), " ",
      when(ev.created_at_ms), " ",
      el("span", { class: "muted", text: lbl("actor", ev.actor_type) + (bits.length ? " · " + bits.join(", ") : "") }));
  }

  async function pageRun(view, mine, runId) {
    let run = await get(pp("/runs/" + enc(runId)));
    if (!current(mine)) return;
    const title = el("h1");
    const facts = el("div");
    const actions = el("p", { class: "actions" });
    const timeline = el("ol", { class: "timeline", id: "run-events" });
    const pre = el("pre", { class: "log", tabindex: "0", "aria-label": t("log"), id: "run-log" });
    // The cancellation card: shown once a cancel was asked for, re-read with the run's facts.
    const cancelBox = el("section", { "aria-labelledby": "cx-title", id: "run-cancellation", hidden: true });
    // What the dispatcher said while it could not place the run (docs/dispatch.md), redrawn with the facts.
    const sawBox = el("section", { "aria-labelledby": "ds-title", id: "run-dispatch-reasons", hidden: true });
    const drawSaw = () => {
      const seen = run.dispatch_reasons || [];
      sawBox.hidden = seen.length === 0;
      if (!seen.length) { put(sawBox); return; }
      put(sawBox, el("h2", { id: "ds-title", text: t("dispatcher_saw") }), el("ul", {}, ...seen.map((r) => el("li", { "data-value": r.reason },
        el("code", { text: r.reason }), " " + lbl("dispatch_reason", r.reason) + (r.scope === "cycle" ? " " + t("every_queued_run") : ""),
        el("span", { class: "muted", text: " · " + t("last_seen", { when: absTime(r.last_seen_at_ms), n: r.count }) })))));
    };
    const delay = delayInput();
    delay.id = "rearm-delay";
    const drawCancellation = async () => {
      if (!run.cancel_requested_at_ms) { cancelBox.hidden = true; return; }
      // a delay being typed or an open confirmation is not wiped by the poll
      if (cancelBox.contains(document.activeElement) || $("confirm").open) return;
      const facts = await get(pp("/runs/" + enc(run.id) + "/cancellation"));
      if (!current(mine) || cancelBox.contains(document.activeElement) || $("confirm").open) return;
      put(cancelBox, el("h2", { id: "cx-title", text: t("cancellation") }), cancellationFacts(run, facts, delay, async () => {
        run = await get(pp("/runs/" + enc(run.id)));
        if (!current(mine)) return;
        drawFacts();
        await drawCancellation();
      }));
      cancelBox.hidden = false;
    };
    const search = el("input", { type: "search", placeholder: t("search"), "aria-label": t("search"), id: "log-search" });
    const matchInfo = el("span", { class: "muted", id: "log-matches", "aria-live": "polite" });
    const followState = el("span", { class: "muted", id: "log-follow" });
    const logRange = el("span", { class: "muted", id: "log-range" });
    const follow = { complete: false, paused: false, timer: null, eventsAfter: 0 };
    let lv = null;
    const pauseBtn = btn(t("pause"), () => {
      follow.paused = !follow.paused;
      pauseBtn.textContent = follow.paused ? t("resume") : t("pause");
      pauseBtn.setAttribute("aria-pressed", String(follow.paused));
      if (!follow.paused) { if (lv.state.atEnd) pre.scrollTop = pre.scrollHeight; else lv.toEnd(); }
    }, "toggle", { "aria-pressed": "false", id: "log-pause" });
    // reading a match: stop the view from jumping to the end
    lv = logView(runId, mine, pre, { search: search, matchInfo: matchInfo, range: logRange, reading: () => { if (!follow.paused) pauseBtn.click(); } });
    search.addEventListener("input", () => lv.redraw());
    search.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); lv.find(e.shiftKey ? -1 : 1); } });
    const logBar = el("div", { class: "logbar" }, search, matchInfo, btn(t("prev"), () => lv.find(-1), null, { id: "log-prev" }),
      btn(t("next"), () => lv.find(1), null, { id: "log-next" }), pauseBtn,
      btn(t("jump_start"), () => lv.toStart(), null, { id: "log-start" }), btn(t("jump_end"), () => lv.toEnd(), null, { id: "log-end" }),
      btn(t("download"), () => downloadLog(run).catch(fail), null, { id: "log-download" }), followState, logRange);

    const drawFacts = () => {
      put(title, t("run") + " " + short(run.id) + " ", copyIdButton(run.id), " ", vbadge("status", run.status));
      drawSaw();
      put(facts, fields([
        [t("task"), run.task_name ? link("#/tasks/" + enc(run.task_name), run.task_name) : short(run.task_id)],
        [t("revision"), "r" + run.task_revision],
        [t("trigger"), lbl("trigger", run.trigger || run.trigger_type)],
        [t("attempt"), run.attempt],
        [t("status"), el("span", {}, vbadge("status", run.status), run.waiting_reason ? " " + t("waiting", { reason: lbl("waiting", run.waiting_reason) }) : "")],
        [t("created"), when(run.created_at_ms)],
        [t("started"), when(run.started_at_ms)],
        [t("finished"), when(run.finished_at_ms)],
        [t("duration"), runDuration(run)],
        [t("exit"), run.exit_code],
        [t("error_code"), run.error_code],
        [t("cancel_reason"), lbl("cancel_reason", run.cancel_reason)],
        [t("id"), el("code", { text: run.id })],
      ]));
      const live = !TERMINAL.has(run.status);
      put(actions, 
        live && can("run.stop") && !run.cancel_requested_at_ms ? btn(t("cancel_run"), async () => {
          if (!(await confirmAction(t("cancel_confirm", { id: short(run.id), task: run.task_name || "" }), t("cancel_yes")))) return;
          try {
            await post(pp("/runs/" + enc(run.id) + "/cancel"));
            say(t("cancel_requested", { id: short(run.id) }));
            run = await get(pp("/runs/" + enc(run.id)));
            drawFacts();
            await drawCancellation();
          } catch (e) { fail(e); }
        }, "danger", { id: "run-cancel" }) : null,
        can("run.create") ? btn(t("rerun"), () => startRun({ id: run.task_id, name: run.task_name }, run.id).catch(fail), null, { id: "run-rerun" }) : null);
    };

    const pollEvents = async () => {
      for (let i = 0; i < 20; i++) { // bounded: at most 20 pages of events per poll
        const page = await get(pp("/runs/" + enc(run.id) + "/events?after=" + follow.eventsAfter + "&limit=100"));
        if (!current(mine)) return;
        for (const ev of page.items) { timeline.append(eventLine(ev)); follow.eventsAfter = ev.sequence; }
        if (page.next_after === null || page.items.length === 0) return;
      }
    };

    const pollLog = async () => {
      await lv.tail(!follow.paused);
      follow.complete = lv.state.complete;
      followState.textContent = follow.complete ? t("log_done") : t("following");
    };

    const loop = async () => {
      follow.timer = null;
      if (!current(mine)) return;
      try {
        if (!TERMINAL.has(run.status) || !follow.complete) {
          run = await get(pp("/runs/" + enc(run.id)));
          if (!current(mine)) return;
          drawFacts();
          await drawCancellation();
          await pollEvents();
          await pollLog();
          if (follow.complete && current(mine)) {
            // the log is whole only once the run is terminal: show the final facts and events too
            run = await get(pp("/runs/" + enc(run.id)));
            if (!current(mine)) return;
            drawFacts();
            await drawCancellation();
            await pollEvents();
          }
        }
      } catch (e) {
        if (!(e instanceof ApiError && e.code === "network_error")) fail(e);
      }
      if (current(mine) && !follow.complete) follow.timer = setTimeout(loop, LOG_POLL_MS);
    };
    cleanup.push(() => { if (follow.timer) clearTimeout(follow.timer); });

    drawFacts();
    await drawCancellation();
    if (!current(mine)) return;
    put(view, title, actions, el("section", {}, facts), sawBox, cancelBox,
      el("section", { "aria-labelledby": "log-title" }, el("h2", { id: "log-title", text: t("log") }), logBar, pre),
      el("section", { "aria-labelledby": "timeline-title" }, el("h2", { id: "timeline-title", text: t("timeline") }), timeline));
    await pollEvents();
    await lv.toEnd(); // tail-first: one ranged read of the end of the log
    follow.complete = lv.state.complete;
    followState.textContent = follow.complete ? t("log_done") : t("following");
    if (current(mine) && (!follow.complete || !TERMINAL.has(run.status))) {
      follow.complete = false; // a log read whole before the run's facts caught up: read both again
      follow.timer = setTimeout(loop, LOG_POLL_MS);
    }
  }

  // --- cancellation: its facts, and rearming a blocked one (what `ql3 run rearm` does) ---------------
  // A client mutation id (the API replays the same id with the same input); getRandomValues works on
  // plain http too, where crypto.randomUUID does not exist.
  function mutationId() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return "console." + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function conflictText(e) {
    return t("stale", { reason: (e.details && e.details.reason) || e.code });
  }

  function delayInput() {
    return el("input", { type: "number", name: "rearm_delay", min: 1, max: 86400, step: "any", value: 60,
      "aria-label": t("rearm_delay"), class: "delay" });
  }

  // Rearm sends exactly the dispatch version and blocking result on the page: a dispatch that moved on
  // is a 409 from the API (shown, then re-read), never a rearm of something the user did not see.
  function rearmButton(run, view, delay, onChange, extra) {
    const d = view.dispatch;
    return btn(t("rearm"), async () => {
      const seconds = Number(delay.value);
      if (!delay.checkValidity() || !(seconds >= 1 && seconds <= 86400)) {
        say(t("rearm_delay") + ": 1–86400", true);
        delay.focus();
        return;
      }
      const expected = { version: d.version, result: d.lastResult };
      const message = t("rearm_confirm", { id: short(run.id), result: lbl("result", expected.result),
        version: expected.version, delay: seconds });
      if (!(await confirmAction(message, t("rearm")))) return;
      try {
        const res = await post(pp("/runs/" + enc(run.id) + "/cancellation/rearm"), {
          mutation_id: mutationId(), expected_dispatch_version: expected.version,
          expected_last_result: expected.result, retry_delay_ms: Math.round(seconds * 1000),
        });
        say(t("rearmed", { id: short(run.id), when: absTime(res.body.nextAttemptAtMs) }));
      } catch (e) {
        if (e instanceof ApiError && e.status === 409) say(conflictText(e), true); else fail(e);
      }
      await onChange();
    }, "danger", Object.assign({ "data-action": "rearm" }, extra || {}));
  }

  // The facts of GET .../runs/{id}/cancellation: why it is blocked, how often a stop was tried, the
  // last result and the next try; Rearm when it is blocked and the role may stop runs.
  function cancellationFacts(run, view, delay, onChange) {
    const d = view.dispatch;
    const blocked = view.operatorAction === "rearm" && d;
    const out = [fields([
      [t("cancel_requested_at"), when(view.cancelRequestedAtMs)],
      [t("cancel_reason"), lbl("cancel_reason", view.cancelReason)],
      [t("dispatch_status"), d ? vbadge("dispatch", d.status) : t("no_dispatch")],
      [t(blocked ? "blocked_reason" : "last_result"),
        d && d.lastResult ? el("span", { "data-result": d.lastResult, text: lbl("result", d.lastResult) }) : null],
      [t("dispatch_attempts"), d ? el("span", { "data-fact": "attempts", text: d.dispatchCount }) : null],
      [t("last_tried"), d ? when(d.lastDispatchedAtMs) : null],
      [t("next_attempt"), d ? when(d.nextAttemptAtMs) : null],
      [t("dispatch_version"), d ? el("span", { "data-fact": "version", text: d.version }) : null],
      [t("operator_action"), lbl("operator_action", view.operatorAction)],
    ])];
    if (blocked && can("run.stop")) {
      out.push(el("p", { class: "notice", text: t("rearm_hint") }),
        el("p", { class: "actions" }, el("label", { class: "inline" }, t("rearm_delay"), " ", delay),
          rearmButton(run, view, delay, onChange, { id: "rearm" })));
    }
    return out;
  }

  async function pageCancellations(view, mine) {
    const delay = delayInput();
    const summaryBox = el("div");
    const listBox = el("div");
    const state = { items: [], next: null, pages: 1 };
    const more = btn(t("more"), () => loadPage(state.next).then(draw).catch(fail));
    const loadPage = async (cursor) => {
      const page = await get(pp("/cancellation/blocked" + (cursor ? "?cursor=" + enc(cursor) : "")));
      // at most 16 runs per page (the API's fixed page), each read with its cancellation facts
      const rows = await Promise.all(page.items.map(async (item) => {
        const [run, facts] = await Promise.all([
          get(pp("/runs/" + enc(item.runId))), get(pp("/runs/" + enc(item.runId) + "/cancellation")),
        ]);
        return { item: item, run: run, facts: facts };
      }));
      if (cursor) { state.items = state.items.concat(rows); state.pages += 1; } else { state.items = rows; state.pages = 1; }
      state.next = page.truncated ? page.nextCursor : null;
    };
    const drawSummary = (health) => put(summaryBox, el("p", {}, vbadge("assessment", health.assessment)),
      fields([[t("h_blocked"), String(health.dispatches.blocked)], [t("h_pending"), String(health.dispatches.pending)],
        [t("h_due"), String(health.signals.due)], [t("oldest_blocked"), when(health.oldestBlockedAtMs)]]));
    const draw = () => {
      if (!current(mine)) return;
      put(listBox, table([t("run"), t("task"), t("blocked_at"), t("blocked_reason"), t("dispatch_attempts"),
        t("dispatch_version"), t("next_attempt"), t("actions")],
      state.items.map(({ item, run, facts }) => {
        const d = facts.dispatch;
        return {
          id: run.id,
          cells: [
            link("#/runs/" + enc(run.id), short(run.id), "mono"),
            run.task_name ? link("#/tasks/" + enc(run.task_name), run.task_name) : short(run.task_id),
            when(item.blockedAtMs),
            d && d.lastResult ? el("span", { "data-result": d.lastResult, text: lbl("result", d.lastResult) }) : "",
            d ? el("span", { "data-fact": "attempts", text: d.dispatchCount }) : "",
            d ? el("span", { "data-fact": "version", text: d.version }) : "",
            d ? whenRel(d.nextAttemptAtMs) : "",
            facts.operatorAction === "rearm" && d && can("run.stop") ? rearmButton(run, facts, delay, reload) : lbl("operator_action", facts.operatorAction),
          ],
        };
      }), t("no_blocked"), t("blocked_title")));
      more.hidden = !state.next;
    };
    const reload = async () => {
      const [health] = await Promise.all([get(pp("/cancellation/summary")), loadPage(null)]);
      if (!current(mine)) return;
      drawSummary(health);
      draw();
    };
    await reload();
    if (!current(mine)) return;
    put(view, el("h1", { text: t("blocked_title") }),
      el("section", { "aria-labelledby": "cx-health" }, el("h2", { id: "cx-health", text: t("health") }), summaryBox),
      el("section", { "aria-labelledby": "cx-blocked" }, el("h2", { id: "cx-blocked", text: t("blocked_title") }),
        can("run.stop") ? el("p", { class: "actions" }, el("label", { class: "inline" }, t("rearm_delay"), " ", delay)) : null,
        listBox, el("p", { class: "actions" }, more)));
    // a refresh never wipes a delay being typed or a confirmation; after "More" the snapshot stays
    setRefresh(async () => { if (!deciding(view) && !$("confirm").open && state.pages === 1) await reload(); });
  }

  // --- approvals ------------------------------------------------------------------------------------
  // Names of principals (requester, decider), looked up once per page load; the id is the fallback.
  const principalNames = new Map();
  function principalName(id) {
    if (!id) return Promise.resolve("");
    if (!principalNames.has(id)) {
      principalNames.set(id, get(pp("/principals/" + enc(id))).then((p) => p.name, () => short(id)));
    }
    return principalNames.get(id);
  }
  function whoCell(id) {
    const cell = el("span", { "data-principal": id || "", text: id && id === me.principalId ? t("you") : short(id) });
    if (id && id !== me.principalId) principalName(id).then((name) => { cell.textContent = name; });
    return cell;
  }

  // A revision's spec as the task views read it: command and cwd are present only when visible.
  function revisionView(rev) {
    const spec = rev.spec;
    return { command_visible: "command" in spec, command: spec.command, cwd: spec.cwd, has_cwd: spec.has_cwd,
      env_keys: spec.env_keys || [], require: spec.require, prefer: spec.prefer, revision: rev.revision };
  }

  async function whatRuns(approval, taskById, box) {
    const task = taskById.get(approval.action_ref);
    if (!task) { put(box, el("p", { class: "muted", text: t("not_found") })); return; }
    const revs = (await get(pp("/tasks/" + enc(task.id) + "/revisions"))).items;
    // What the request is bound to, not what the task is now (the run uses the bound revision).
    const bound = approval.task_revision || task.revision;
    const i = revs.findIndex((r) => r.revision === bound);
    if (i < 0) { put(box, el("p", { class: "muted", text: t("revision_gone", { revision: "r" + bound }) })); return; }
    const rev = revisionView(revs[i]);
    put(box, fields([
      [t("revision"), el("span", { "data-bound-revision": String(bound) }, "r" + bound,
        bound !== task.revision ? el("span", { class: "muted", text: " · " + t("task_now_at", { revision: "r" + task.revision }) }) : null)],
      [t("command"), commandView(rev)],
      [t("cwd"), cwdView(rev)],
      [t("env_keys"), rev.env_keys.join(", ") || t("none")],
      [t("placement"), placement(rev)],
      [t("diff_prev"), i + 1 < revs.length ? diffList(specDiff(revs[i + 1].spec, revs[i].spec)) : t("first_revision")],
    ]));
  }

  // A decision in progress (a focused control or an open "what will run") is not wiped by a refresh.
  function deciding(view) {
    return (view.contains(document.activeElement) && document.activeElement !== view)
      || Boolean(view.querySelector("details[open]"));
  }

  async function pageApprovals(view, mine, refreshing) {
    const [pending, recent, tasks] = await Promise.all([
      get(pp("/approvals?state=pending&limit=100")), get(pp("/approvals?limit=50")), get(pp("/tasks?limit=200")),
    ]);
    if (!current(mine) || (refreshing && deciding(view))) return; // checked after the wait, too
    const taskById = new Map(tasks.items.map((x) => [x.id, x]));
    const decide = async (a, decision, code, note) => {
      const body = { reason_code: code };
      if (note && note.trim()) body.note = note.trim();
      try {
        await post(pp("/approvals/" + enc(a.id) + "/" + decision), body);
        say(decision === "approve" ? t("approved") : t("rejected"));
        await pageApprovals(view, mine);
        await refreshBadge();
      } catch (e) { fail(e); }
    };
    const rows = pending.items.map((a) => {
      const task = taskById.get(a.action_ref);
      const own = a.requested_by === me.principalId;
      const box = el("div", { class: "what" });
      let controls = null;
      if (can("approval.decide") && own) controls = el("span", { class: "muted", text: t("own_request") });
      else if (can("approval.decide")) {
        const reason = el("select", { "aria-label": t("reason") }, REJECT_REASONS.map((r) => el("option", { value: r, text: lbl("reason", r) })));
        const note = el("input", { type: "text", placeholder: t("free_text"), "aria-label": t("free_text"), maxlength: 500 });
        controls = el("span", { class: "actions" },
          btn(t("approve"), () => decide(a, "approve", "approved", note.value), "primary", { "data-action": "approve" }),
          btn(t("reject"), () => decide(a, "reject", reason.value, note.value), "danger", { "data-action": "reject" }),
          reason, note);
      }
      const details = can("approval.decide") ? el("details", { ontoggle: (e) => { if (e.target.open) whatRuns(a, taskById, box).catch(fail); } },
        el("summary", { text: t("what_runs") }), box) : null;
      return {
        id: a.id,
        cells: [
          task ? link("#/tasks/" + enc(task.name), task.name) : short(a.action_ref),
          a.task_revision ? "r" + a.task_revision : "",
          whoCell(a.requested_by),
          when(a.requested_at_ms),
          when(a.expires_at_ms),
          vbadge("approval", a.effective_state),
          el("div", {}, controls, details),
        ],
      };
    });
    const decided = recent.items.filter((a) => a.effective_state !== "pending").map((a) => ({
      id: a.id,
      cells: [taskById.get(a.action_ref) ? taskById.get(a.action_ref).name : short(a.action_ref), whoCell(a.requested_by),
        vbadge("approval", a.effective_state), a.reason_code ? lbl("reason", a.reason_code) : "", a.note ? el("span", { class: "note", text: a.note }) : "",
        whoCell(a.decided_by), when(a.decided_at_ms || a.requested_at_ms)],
    }));
    put(view, el("h1", { text: t("nav_approvals") }),
      el("section", { "aria-labelledby": "ap-pending" }, el("h2", { id: "ap-pending", text: t("pending_approvals") }),
        table([t("task"), t("revision"), t("requested_by"), t("requested"), t("expires"), t("state"), t("actions")], rows, t("no_pending"), t("pending_approvals"))),
      el("section", { "aria-labelledby": "ap-decided" }, el("h2", { id: "ap-decided", text: t("decided") }),
        table([t("task"), t("requested_by"), t("state"), t("reason"), t("note"), t("decided_by"), t("decided_at")], decided, t("no_approvals"), t("decided"))));
    setRefresh(async () => {
      if (!deciding(view)) await pageApprovals(view, mine, true);
    });
  }

  // --- approved actions: list, detail, and the manual resolution (what `ql3 action resolve` does) -----
  const OUTCOMES = ["succeeded", "failed", "abandoned"];
  const REASON_CODE = "[a-z][a-z0-9_]{0,63}"; // the API's reason-code rule; it checks it again

  function actionTarget(a, taskById) {
    const task = a.action_type === "run.create" ? taskById.get(a.action_ref) : null;
    return el("span", {}, el("code", { text: a.action_type }), " ",
      task ? link("#/tasks/" + enc(task.name), task.name) : el("span", { class: "mono", text: short(a.action_ref) }));
  }

  async function pageActions(view, mine) {
    const tasks = (await get(pp("/tasks?limit=200"))).items;
    if (!current(mine)) return;
    const taskById = new Map(tasks.map((x) => [x.id, x]));
    const holder = el("div");
    const state = { cursors: [null], items: [], next: null };
    const more = btn(t("older"), () => loadMore().catch(fail));
    const draw = () => {
      put(holder, table([t("id"), t("status"), t("action"), t("version"), t("attempts"), t("approval_request"), t("created"), t("result")],
        state.items.map((a) => ({
          id: a.dispatch_id,
          cells: [
            link("#/actions/" + enc(a.dispatch_id), short(a.dispatch_id), "mono"),
            vbadge("action", a.effective_status),
            actionTarget(a, taskById),
            String(a.version),
            a.attempt_count + " / " + a.max_attempts,
            el("span", { class: "mono", text: short(a.approval_request_id) }),
            when(a.created_at_ms),
            a.result_code || "",
          ],
        })), t("no_actions"), t("actions_title")));
      more.hidden = !state.next;
    };
    // like the runs list: a refresh re-reads every page already shown, each from its own cursor
    const reload = async () => {
      const seen = new Set();
      const items = [];
      let next = null;
      for (const cursor of state.cursors.slice(0, MAX_REFRESH_PAGES)) {
        const page = await get(pp("/actions?limit=50" + (cursor ? "&cursor=" + enc(cursor) : "")));
        for (const a of page.items) if (!seen.has(a.dispatch_id)) { seen.add(a.dispatch_id); items.push(a); }
        next = page.next_cursor;
      }
      if (!current(mine)) return;
      state.items = items;
      state.next = next;
      draw();
    };
    const loadMore = async () => {
      if (!state.next) return;
      const page = await get(pp("/actions?limit=50&cursor=" + enc(state.next)));
      if (!current(mine)) return;
      state.cursors.push(state.next);
      const seen = new Set(state.items.map((a) => a.dispatch_id));
      for (const a of page.items) if (!seen.has(a.dispatch_id)) state.items.push(a);
      state.next = page.next_cursor;
      draw();
    };
    await reload();
    if (!current(mine)) return;
    put(view, el("h1", { text: t("actions_title") }), el("section", {}, holder, el("p", { class: "actions" }, more)));
    setRefresh(reload);
  }

  // Resolve sends the version on the page (expected_version): an action that moved on is a 409 from
  // the API (shown, then re-read). There is no retry: the person states what happened, once.
  function resolveForm(a, onDone) {
    const choices = OUTCOMES.map((o) => el("label", { class: "choice" },
      el("input", { type: "radio", name: "outcome", value: o, required: true }), " ", lbl("outcome", o)));
    const reason = el("input", { name: "reason_code", value: "manual_resolution", required: true, pattern: REASON_CODE,
      maxlength: 64, "aria-label": t("reason_code") });
    const form = el("form", { class: "resolve", id: "resolve-form", "aria-label": t("resolve") },
      el("p", { class: "notice", text: t("resolve_hint") }),
      el("fieldset", {}, el("legend", { text: t("outcome") }), choices),
      el("label", {}, t("reason_code"), " ", reason),
      el("p", { class: "actions" }, el("button", { type: "submit", class: "danger", id: "resolve", text: t("resolve") })));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const picked = form.querySelector("input[name=outcome]:checked");
      if (!picked || !form.reportValidity()) return;
      const outcome = picked.value;
      const expected = a.version;
      if (!(await confirmAction(t("resolve_confirm", { id: short(a.dispatch_id), outcome: lbl("outcome", outcome) }), t("resolve")))) return;
      try {
        const res = await post(pp("/actions/" + enc(a.dispatch_id) + "/resolve"), {
          outcome: outcome, expected_version: expected, reason_code: reason.value, mutation_id: mutationId(),
        });
        say(t("resolved", { id: short(a.dispatch_id), status: lbl("action", res.body.status) }));
      } catch (e) {
        if (e instanceof ApiError && e.status === 409) say(conflictText(e), true); else fail(e);
      }
      await onDone();
    });
    return form;
  }

  async function pageAction(view, mine, id) {
    const [a, tasks] = await Promise.all([get(pp("/actions/" + enc(id))), get(pp("/tasks?limit=200"))]);
    if (!current(mine)) return;
    const taskById = new Map(tasks.items.map((x) => [x.id, x]));
    const needsPerson = a.effective_status === "recovery_required";
    // A blocked action is terminal: say so, and what a person can do instead (ask again).
    const task = a.action_type === "run.create" ? taskById.get(a.action_ref) : null;
    const blocked = a.effective_status === "blocked" ? el("section", { "aria-labelledby": "ac-blocked", class: "attention", id: "action-blocked" },
      el("h2", { id: "ac-blocked", text: t("blocked_final") }),
      el("p", { text: t("blocked_why") }),
      el("p", { text: task ? t("blocked_next_run", { task: task.name }) : t("blocked_next") }),
      task && can("run.create") ? el("p", { class: "actions" },
        btn(t("start_again", { task: task.name }), () => startRun(task).catch(fail), null, { id: "action-start-again" })) : null)
      : null;
    put(view,
      el("h1", {}, t("action") + " " + short(a.dispatch_id) + " ", copyIdButton(a.dispatch_id), " ", vbadge("action", a.effective_status)),
      blocked,
      needsPerson ? el("section", { "aria-labelledby": "ac-resolve", class: "attention" },
        el("h2", { id: "ac-resolve", text: t("needs_person") }),
        can("approval.recover") ? resolveForm(a, () => pageAction(view, mine, id)) : el("p", { class: "notice", text: t("resolve_role") }))
        : null,
      el("section", {}, fields([
        [t("action"), actionTarget(a, taskById)],
        [t("status"), vbadge("action", a.effective_status)],
        [t("version"), String(a.version)],
        [t("attempts"), a.attempt_count + " / " + a.max_attempts],
        [t("approval_request"), el("code", { text: a.approval_request_id })],
        [t("created"), when(a.created_at_ms)],
        [t("eligible"), when(a.eligible_at_ms)],
        [t("started"), when(a.started_at_ms)],
        [t("lease_expires"), when(a.lease_expires_at_ms)],
        [t("completed"), when(a.completed_at_ms)],
        [t("updated"), when(a.updated_at_ms)],
        [t("result"), a.result_code],
        [t("recovery"), lbl("recovery", a.recovery_status)],
        [t("recovery_finding"), a.recovery_last_finding ? lbl("finding", a.recovery_last_finding) : null],
        [t("id"), el("code", { text: a.dispatch_id })],
      ])));
    // nothing to decide while it is not waiting for a person: follow it; a form being filled stays
    if (!needsPerson && !["succeeded", "failed", "blocked"].includes(a.effective_status)) {
      setRefresh(() => pageAction(view, mine, id));
    }
  }

  // --- workers --------------------------------------------------------------------------------------
  async function pageWorkers(view, mine) {
    const page = await get(pp("/workers"));
    if (!current(mine)) return;
    const rows = page.items.map((w) => ({
      id: w.id,
      cells: [
        el("code", { text: w.id }), vbadge("worker", w.status),
        (w.busy ?? w.active_runs) + " / " + (w.slots ?? w.max_concurrent_runs),
        Object.entries(w.labels || {}).map(([k, v]) => k + "=" + v).join(", "),
        (w.executors || []).join(", "),
        when(w.last_heartbeat_at_ms),
        can("worker.manage") && w.status === "online" ? btn(t("drain"), async () => {
          if (!(await confirmAction(t("drain_confirm", { id: w.id }), t("drain")))) return;
          try {
            await post("/workers/" + enc(w.id) + "/drain");
            say(t("drained", { id: w.id }));
            await pageWorkers(view, mine);
          } catch (e) { fail(e); }
        }, "danger") : "",
      ],
    }));
    put(view, el("h1", { text: t("nav_workers") }), el("section", {},
      table([t("worker"), t("status"), t("slots"), t("labels"), t("executors"), t("heartbeat"), t("actions")], rows, t("no_workers"), t("nav_workers"))));
    setRefresh(() => pageWorkers(view, mine));
  }

  // --- scripts --------------------------------------------------------------------------------------
  // The editor: a textarea over a coloured copy of its text (same font, same wrapping), with a line
  // number gutter. Colouring is a small tokenizer (comments, strings, numbers, keywords): no build step.
  const KEYWORDS = new Set(("and as async await break case catch class const continue def del elif else except export " +
    "false finally for from function if import in is lambda let new none not null or pass raise return self switch " +
    "this throw true try var while with yield fi then do done esac echo local True False None").split(" "));
  const TOKEN_RE = /(#[^\n]*|\/\/[^\n]*|\/\*[\s\S]*?\*\/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`|\b\d+(?:\.\d+)?\b|\b[A-Za-z_]\w*\b)/g;

  function colour(text) {
    const out = [];
    let last = 0;
    for (const m of text.matchAll(TOKEN_RE)) {
      const tok = m[0];
      let cls = null;
      if (tok[0] === "#" || tok.startsWith("//") || tok.startsWith("/*")) cls = "tk-comment";
      else if (tok[0] === "\"" || tok[0] === "'" || tok[0] === "`") cls = "tk-string";
      else if (/^\d/.test(tok)) cls = "tk-number";
      else if (KEYWORDS.has(tok)) cls = "tk-keyword";
      if (!cls) continue;
      if (m.index > last) out.push(text.slice(last, m.index));
      out.push(el("span", { class: cls, text: tok }));
      last = m.index + tok.length;
    }
    out.push(text.slice(last) + "\n");
    return out;
  }

  function codeEditor(text, readOnly) {
    const gutter = el("pre", { class: "gutter", "aria-hidden": "true" });
    const shade = el("pre", { class: "shade", "aria-hidden": "true" });
    const area = el("textarea", { id: "script-content", class: "code", spellcheck: "false", wrap: "off",
      "aria-label": t("content"), readonly: readOnly || null, autocapitalize: "off", autocomplete: "off" });
    area.value = text;
    function paint() {
      const lines = area.value.split("\n").length;
      gutter.textContent = Array.from({ length: lines }, (_, i) => String(i + 1)).join("\n");
      put(shade, colour(area.value));
      shade.scrollTop = area.scrollTop; shade.scrollLeft = area.scrollLeft; gutter.scrollTop = area.scrollTop;
    }
    area.addEventListener("input", paint);
    area.addEventListener("scroll", () => {
      shade.scrollTop = area.scrollTop; shade.scrollLeft = area.scrollLeft; gutter.scrollTop = area.scrollTop;
    });
    area.addEventListener("keydown", (ev) => {
      if (ev.key !== "Tab" || readOnly) return;
      ev.preventDefault();
      area.setRangeText("    ", area.selectionStart, area.selectionEnd, "end");
      paint();
    });
    paint();
    return { node: el("div", { class: "editor" }, gutter, el("div", { class: "code-wrap" }, shade, area)), area: area };
  }

  function diffView(text) {
    return el("pre", { class: "diff" }, text.split("\n").map((line) => el("span", {
      class: line.startsWith("+") && !line.startsWith("+++") ? "add" : line.startsWith("-") && !line.startsWith("---") ? "del" : null,
      text: line + "\n" })));
  }

  async function pageScripts(view, mine) {
    const page = await get(pp("/scripts?limit=500"));
    if (!current(mine)) return;
    const rows = page.items.map((s) => ({
      id: s.path,
      cells: [link("#/scripts/" + enc(s.path), s.path), "r" + s.revision, String(s.size_bytes), s.updated_by, when(s.updated_at_ms)],
    }));
    let form = null;
    if (can("task.write")) {
      const path = el("input", { id: "new-script-path", required: true, maxlength: 255, placeholder: "jobs/sign.py" });
      form = el("form", { class: "inline", onsubmit: (ev) => {
        ev.preventDefault();
        if (path.value.trim()) go("#/scripts/" + enc(path.value.trim()) + "?new=1");
      } }, el("label", {}, t("path"), " ", path), el("button", { type: "submit", class: "primary", text: t("new_script") }));
    }
    put(view, el("h1", { text: t("nav_scripts") }),
      form ? el("section", {}, form) : null,
      el("section", {}, table([t("path"), t("revision"), t("bytes"), t("by"), t("updated")], rows, t("no_scripts"), t("nav_scripts"))));
    setRefresh(() => pageScripts(view, mine));
  }

  async function runScript(path) {
    // The task that names the script, or a new one for it (no schedule); then its live run page.
    const tasks = await get(pp("/tasks?limit=200"));
    let task = tasks.items.find((x) => x.script === path);
    if (!task) {
      const name = path.replace(/\//g, "_").replace(/[^A-Za-z0-9._-]+/g, "-").replace(/^[-._]+|[-._]+$/g, "").slice(0, 128) || "script";
      task = (await post(pp("/tasks"), { name: name, script: path })).body;
    }
    await startRun(task);
  }

  async function pageScript(view, mine, path, params) {
    const fresh = params.get("new") === "1";
    let script = null;
    try {
      script = await get(pp("/scripts/" + enc(path)));
    } catch (e) {
      if (!(fresh && e instanceof ApiError && e.status === 404)) throw e;
    }
    if (!current(mine)) return;
    const writable = can("task.write");
    const editor = codeEditor(script ? script.content : "", !writable);
    const history = el("div", { id: "script-history" });
    const diffBox = el("div", { id: "script-diff" });
    async function showHistory() {
      if (!script) return;
      const revs = await get(pp("/script-history/" + enc(path)));
      put(history, table([t("revision"), t("by"), t("source"), t("updated"), ""], revs.items.map((r) => ({
        id: String(r.revision),
        cells: ["r" + r.revision, r.author, r.source, when(r.created_at_ms),
          btn(r.deleted ? t("rev_deleted") : t("show_diff"), async () => {
            try {
              const one = await get(pp("/script-history/" + enc(path) + "?revision=" + r.revision));
              put(diffBox, el("h3", { text: "r" + r.revision }), diffView(one.items[0].diff || ""));
            } catch (e) { fail(e); }
          })],
      })), t("no_scripts"), t("history")));
    }
    const actions = writable ? el("p", { class: "actions" },
      btn(t("save"), async () => {
        try {
          const res = await request("PUT", pp("/scripts/" + enc(path)), { content: editor.area.value });
          say(res.body.changed ? t("script_saved", { rev: res.body.revision }) : t("script_unchanged"));
          script = await get(pp("/scripts/" + enc(path)));
          if (fresh) { go("#/scripts/" + enc(path)); return; }
          await showHistory();
        } catch (e) { fail(e); }
      }, "primary", { id: "script-save" }),
      script ? btn(t("run_now"), async () => {
        try { await runScript(path); } catch (e) { fail(e); }
      }, null, { id: "script-run" }) : null,
      script ? btn(t("delete"), async () => {
        if (!(await confirmAction(t("script_delete_confirm", { path: path }), t("delete")))) return;
        try {
          await request("DELETE", pp("/scripts/" + enc(path)));
          go("#/scripts");
        } catch (e) { fail(e); }
      }, "danger", { id: "script-delete" }) : null) : null;
    put(view, el("h1", { text: path }),
      script ? fields([[t("revision"), "r" + script.revision], [t("by"), script.updated_by], [t("updated"), when(script.updated_at_ms)],
        ["sha256", el("code", { text: script.digest.slice(0, 16) + "…" })]]) : el("p", { class: "muted", text: t("new_script") }),
      el("section", {}, editor.node, actions),
      script ? el("section", { "aria-labelledby": "script-h" }, el("h2", { id: "script-h", text: t("history") }), history, diffBox) : null);
    await showHistory();
  }

  // --- subscriptions --------------------------------------------------------------------------------
  async function pageSubscriptions(view, mine) {
    const page = await get(pp("/subscriptions"));
    if (!current(mine)) return;
    const admin = can("project.admin");
    const logBox = el("div", { id: "sync-log" });
    function showSync(s) {
      put(logBox, el("h2", { text: t("sync_of", { status: lbl("sync", s.status) }) }),
        el("p", {}, s.summary || "", s.run_id ? " · " : "", s.run_id ? link("#/runs/" + enc(s.run_id), short(s.run_id), "mono") : null),
        el("pre", { class: "log", text: s.log }));
    }
    const rows = page.items.map((s) => ({
      id: s.name,
      cells: [s.name, el("code", { text: s.repo }), s.branch || t("none"), s.path || t("none"), s.cron || t("none"),
        s.has_credential ? t("yes") : t("no"),
        el("span", { class: "actions" },
          btn(t("last_sync"), async () => {
            try {
              const syncs = await get(pp("/subscriptions/" + enc(s.name) + "/syncs"));
              if (syncs.items.length) showSync(syncs.items[0]); else say(t("never_synced"));
            } catch (e) { fail(e); }
          }),
          admin ? btn(t("sync_now"), async (ev) => {
            ev.target.disabled = true;
            say(t("syncing"));
            try {
              // The sync is a run of the task ql3-sync-NAME: its page streams git's output.
              const res = await post(pp("/subscriptions/" + enc(s.name) + "/syncs"));
              go("#/runs/" + enc(res.body.run_id));
            } catch (e) { fail(e); ev.target.disabled = false; }
          }, "primary") : null,
          admin ? btn(t("delete"), async () => {
            if (!(await confirmAction(t("subscription_delete_confirm", { name: s.name }), t("delete")))) return;
            try { await request("DELETE", pp("/subscriptions/" + enc(s.name))); await pageSubscriptions(view, mine); } catch (e) { fail(e); }
          }, "danger") : null)],
    }));
    let form = null;
    if (admin) {
      const input = (id, label, extra) => el("label", {}, label, " ", el("input", Object.assign({ id: id }, extra || {})));
      const key = el("textarea", { id: "sub-key", rows: 3, placeholder: "-----BEGIN OPENSSH PRIVATE KEY-----" });
      form = el("form", { class: "stack", onsubmit: async (ev) => {
        ev.preventDefault();
        const val = (id) => $(id).value.trim() || null;
        const body = { name: val("sub-name"), repo: val("sub-repo"), branch: val("sub-branch"), path: val("sub-path"),
          cron: val("sub-cron"), deploy_key: key.value.trim() ? key.value : null };
        try {
          await post(pp("/subscriptions"), body);
          say(t("subscription_added", { name: body.name }));
          await pageSubscriptions(view, mine);
        } catch (e) { fail(e); }
      } },
      el("h2", { text: t("new_subscription") }),
      input("sub-name", t("name"), { required: true, maxlength: 128 }),
      input("sub-repo", t("repository"), { required: true, placeholder: "git@host:owner/scripts.git" }),
      input("sub-branch", t("branch")), input("sub-path", t("path_glob"), { placeholder: "*.js" }),
      input("sub-cron", t("cron"), { placeholder: "0 */6 * * *" }),
      el("label", {}, t("deploy_key"), key),
      el("button", { type: "submit", class: "primary", text: t("add") }));
    }
    put(view, el("h1", { text: t("nav_subscriptions") }),
      el("section", {}, table([t("name"), t("repository"), t("branch"), t("path_glob"), t("cron"), t("deploy_key"), t("actions")], rows,
        t("no_subscriptions"), t("nav_subscriptions"))),
      el("section", { "aria-live": "polite" }, logBox),
      form ? el("section", {}, form) : null);
  }

  // --- tokens ---------------------------------------------------------------------------------------
  async function pageTokens(view, mine) {
    if (!can("project.admin")) {
      put(view, el("h1", { text: t("nav_tokens") }), el("p", { class: "notice", text: t("admin_only") }));
      return;
    }
    let page;
    try {
      page = await get(pp("/tokens"));
    } catch (e) {
      if (!(e instanceof ApiError) || (e.status !== 404 && e.status !== 405)) throw e;
      if (!current(mine)) return;
      put(view, el("h1", { text: t("nav_tokens") }), el("p", { class: "notice", id: "tokens-missing", text: t("tokens_missing") }));
      return;
    }
    if (!current(mine)) return;
    const holder = el("div");
    const draw = (items) => put(holder, table([t("name"), t("role"), t("created"), t("expires_at"), t("last_used"), t("state"), t("actions")],
      items.map((k) => ({
        id: k.id,
        cells: [
          k.name, k.role,
          when(k.created_at_ms),
          k.expires_at_ms ? when(k.expires_at_ms) : t("never"),
          k.last_used_at_ms ? when(k.last_used_at_ms) : t("never"),
          k.revoked_at_ms ? badge("revoked", t("revoked")) : badge("enabled", t("active")),
          k.revoked_at_ms ? "" : btn(t("revoke"), async () => {
            if (!(await confirmAction(t("revoke_confirm", { name: k.name }), t("revoke")))) return;
            try {
              await post(pp("/tokens/" + enc(k.id) + "/revoke"));
              draw((await get(pp("/tokens"))).items);
            } catch (e) { fail(e); }
          }, "danger"),
        ],
      })), t("no_tokens"), t("nav_tokens")));
    draw(page.items);
    const shown = el("div");
    const name = el("input", { name: "name", value: "console", required: true, maxlength: 128, "aria-label": t("name") });
    const role = el("select", { name: "role", "aria-label": t("role") }, Object.keys(PERMS).map((r) => el("option", { value: r, text: r })));
    const form = el("form", { class: "filters", "aria-label": t("new_token") },
      el("label", {}, t("name"), name), el("label", {}, t("role"), role),
      el("button", { type: "submit", class: "primary", text: t("new_token") }));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const res = await post(pp("/tokens"), { name: name.value.trim(), role: role.value });
        put(shown, el("p", { class: "notice" }, t("token_shown_once"), " ", el("code", { text: res.body.token })));
        const again = await get(pp("/tokens"));
        if (current(mine)) draw(again.items);
      } catch (e) { fail(e); }
    });
    put(view, el("h1", { text: t("nav_tokens") }), el("section", {}, form, shown), el("section", {}, holder));
  }

  // --- dependencies (docs/dependencies.md) -----------------------------------------------------------
  async function pageDeps(view, mine) {
    const page = await get(pp("/dependencies"));
    if (!current(mine)) return;
    const admin = can("project.admin");
    const holder = el("div");
    const shown = el("div", { id: "deps-result" });
    const installed = (res) => res.body.run_id
      ? put(shown, el("p", { class: "notice" }, t("deps_install_run"), " ", link("#/runs/" + enc(res.body.run_id), short(res.body.run_id), "mono")))
      : put(shown, el("p", { class: "notice", text: t("deps_unchanged") }));
    const draw = (items) => put(holder, table([t("deps_kind"), t("name"), t("deps_spec"), t("actions")],
      items.map((d) => ({
        id: d.kind + ":" + d.name,
        cells: [d.kind, d.name, el("code", { text: d.spec }),
          admin ? btn(t("remove"), async () => {
            if (!(await confirmAction(t("deps_remove_confirm", { name: d.name }), t("remove")))) return;
            try {
              installed(await request("DELETE", pp("/dependencies/" + enc(d.kind) + "/" + enc(d.name))));
              draw((await get(pp("/dependencies"))).items);
            } catch (e) { fail(e); }
          }, "danger") : ""],
      })), t("deps_none"), t("nav_deps")));
    draw(page.items);
    const parts = [el("h1", { text: t("nav_deps") }), el("p", { class: "muted", text: t("deps_hint") })];
    if (admin) {
      const kind = el("select", { name: "kind", "aria-label": t("deps_kind") }, ["python", "node"].map((k) => el("option", { value: k, text: k })));
      const spec = el("input", { name: "spec", required: true, maxlength: 200, placeholder: "requests==2.32.*", "aria-label": t("deps_spec") });
      const form = el("form", { class: "filters", "aria-label": t("deps_add") },
        el("label", {}, t("deps_kind"), kind), el("label", {}, t("deps_spec"), spec),
        el("button", { type: "submit", class: "primary", text: t("deps_add") }),
        btn(t("deps_install_again"), async () => {
          try { installed(await post(pp("/dependencies/install"))); } catch (e) { fail(e); }
        }));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        try {
          installed(await post(pp("/dependencies"), { kind: kind.value, spec: spec.value.trim() }));
          spec.value = "";
          const again = await get(pp("/dependencies"));
          if (current(mine)) draw(again.items);
        } catch (e) { fail(e); }
      });
      parts.push(el("section", {}, form, shown));
    }
    parts.push(el("section", {}, holder));
    put(view, ...parts);
  }

  // --- project variables and secrets (docs/variables.md) ----------------------------------------------
  async function pageVariables(view, mine) {
    const page = await get(pp("/variables"));
    if (!current(mine)) return;
    const editable = can("task.write");
    const holder = el("div");
    const redraw = async () => { const again = await get(pp("/variables")); if (current(mine)) draw(again.items); };
    const draw = (items) => put(holder, table([t("name"), t("value"), t("state"), t("note"), t("updated"), t("actions")],
      items.map((v) => ({
        id: v.name,
        cells: [
          el("code", { text: v.name }),
          v.secret ? badge("secret", t("secret")) : v.value === null ? el("span", { class: "muted", text: t("hidden") })
            : el("code", { class: "value", text: v.value }),
          v.enabled ? badge("enabled", t("enabled")) : badge("disabled", t("disabled")),
          v.note, when(v.updated_at_ms),
          editable ? btn(t("delete"), async () => {
            if (!(await confirmAction(t("var_delete_confirm", { name: v.name }), t("delete")))) return;
            try { await request("DELETE", pp("/variables/" + enc(v.name))); say(t("var_deleted", { name: v.name })); await redraw(); } catch (e) { fail(e); }
          }, "danger") : "",
        ],
      })), t("no_variables"), t("nav_variables")));
    draw(page.items);
    const sections = [el("p", { class: "muted", text: t("variables_help") })];
    if (editable) {
      const f = {
        name: el("input", { name: "var_name", required: true, maxlength: 128, pattern: "[A-Za-z_][A-Za-z0-9_]*", placeholder: "JD_COOKIE", autocomplete: "off" }),
        value: el("textarea", { name: "var_value", rows: 2, autocomplete: "off", spellcheck: "false" }),
        note: el("input", { name: "var_note", maxlength: 256 }),
        secret: el("input", { type: "checkbox", name: "var_secret" }),
        enabled: el("input", { type: "checkbox", name: "var_enabled", checked: true }),
      };
      const form = el("form", { class: "task", id: "variable-form", "aria-label": t("set_variable") },
        el("label", {}, t("name"), f.name), el("label", {}, t("note"), f.note),
        el("label", { class: "wide" }, t("value"), f.value),
        el("label", { class: "check" }, f.secret, t("secret_write_only")),
        el("label", { class: "check" }, f.enabled, t("enabled")),
        el("p", { class: "actions wide" }, el("button", { type: "submit", class: "primary", text: t("set_variable") })));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        try {
          const name = f.name.value.trim();
          await request("PUT", pp("/variables/" + enc(name)), { value: f.value.value, secret: f.secret.checked, enabled: f.enabled.checked, note: f.note.value });
          f.value.value = "";
          say(t("var_saved", { name }));
          await redraw();
        } catch (e) { fail(e); }
      });
      const text = el("textarea", { name: "import_text", rows: 3, placeholder: "KEY=VALUE", spellcheck: "false" });
      const secret = el("input", { type: "checkbox", name: "import_secret" });
      const importer = el("form", { class: "task", id: "variable-import", "aria-label": t("import_variables") },
        el("label", { class: "wide" }, t("import_help"), text),
        el("label", { class: "check" }, secret, t("import_as_secrets")),
        el("p", { class: "actions wide" }, el("button", { type: "submit", text: t("import_variables") })));
      importer.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        try {
          const res = await post(pp("/variables"), { text: text.value, secret: secret.checked });
          text.value = "";
          say(t("var_imported", { n: res.body.imported }));
          await redraw();
        } catch (e) { fail(e); }
      });
      sections.push(form, importer);
    }
    put(view, el("h1", { text: t("nav_variables") }), el("section", {}, sections), el("section", {}, holder));
  }

  // --- ids and pictures (docs/console.md "Pictures"; the SVG is drawn by charts.js) -------------------
  function copyIdButton(id) {
    return btn(t("copy_id"), () => {
      const done = () => say(t("copied_id", { id: id }));
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(id).then(done, fail);
      else { // plain http: a hidden text area and the old copy command
        const area = el("textarea", { class: "offscreen", "aria-hidden": "true" });
        area.value = id;
        document.body.append(area);
        area.select();
        document.execCommand("copy");
        area.remove();
        done();
      }
    }, "copy-id", { title: id, "data-id": id });
  }

  function runDuration(r) {
    return typeof r.started_at_ms === "number" && typeof r.finished_at_ms === "number"
      ? Math.max(0, r.finished_at_ms - r.started_at_ms) : null;
  }

  // A task's last 50 runs as a strip of bars (one bounded list call), filled in when it answers.
  function runStripSection(task, mine) {
    const box = el("div", { class: "chart-box", id: "run-strip" }, el("p", { class: "muted", text: t("loading") }));
    get(pp("/runs?task=" + enc(task.id) + "&limit=50")).then((page) => {
      if (!current(mine)) return;
      const runs = page.items.slice().reverse().map((r) => {
        const ms = runDuration(r);
        return { href: "#/runs/" + enc(r.id), status: r.status, duration_ms: ms,
          title: t("strip_run", { id: short(r.id), status: lbl("status", r.status),
            duration: ms === null ? t("still_running") : duration(ms), when: absTime(r.created_at_ms) }) };
      });
      put(box, runs.length ? window.QL3Charts.runStrip(runs, t("strip_label", { n: runs.length, task: task.name }))
        : el("p", { class: "muted", text: t("no_runs") }));
    }).catch((e) => { if (current(mine)) put(box, el("p", { class: "muted", text: e.message || String(e) })); });
    return el("section", { "aria-labelledby": "task-strip" }, el("h2", { id: "task-strip", text: t("recent_runs") }), box);
  }

  function bucketTick(bucketMs) {
    return (ms, i) => {
      const d = new Date(ms);
      const hour = utc ? d.getUTCHours() : d.getHours();
      if (bucketMs >= 6 * 3600e3) { // one label a day
        if (hour >= 6) return null;
        return utc ? d.toISOString().slice(5, 10) : (d.getMonth() + 1) + "/" + d.getDate();
      }
      return i % 6 === 0 ? String(hour).padStart(2, "0") + ":00" : null;
    };
  }

  // Runs per hour (24 h) and per 6 h (7 days) by outcome, and busy slots per hour: two aggregate calls.
  function overviewCharts(mine) {
    const day = el("div", { class: "chart-box", id: "chart-runs-24h" }, el("p", { class: "muted", text: t("loading") }));
    const week = el("div", { class: "chart-box", id: "chart-runs-7d" });
    const busy = el("div", { class: "chart-box", id: "chart-busy" });
    const runsChart = (stats, box) => {
      const all = stats.buckets.reduce((n, b) => n + Object.values(b.counts).reduce((a, c) => a + c, 0), 0);
      const bad = stats.buckets.reduce((n, b) => n + (b.counts.failed || 0) + (b.counts.timed_out || 0), 0);
      if (!all) { put(box, el("p", { class: "muted", text: t("no_runs_yet") })); return; }
      put(box, window.QL3Charts.stackedBars(stats.buckets, {
        ariaLabel: t("chart_runs_label", { n: all, failed: bad }), label: (s) => lbl("status", s),
        tick: bucketTick(stats.bucket_ms),
        title: (b, n) => t("bucket_runs", { from: absTime(b.start_ms), n: n,
          parts: Object.entries(b.counts).map(([s, c]) => lbl("status", s) + " " + c).join(", ") }),
      }));
    };
    Promise.all([get(pp("/stats/runs?range=24h")), get(pp("/stats/runs?range=7d"))]).then(([d, w]) => {
      if (!current(mine)) return;
      runsChart(d, day);
      runsChart(w, week);
      const peak = Math.max(0, ...d.buckets.map((b) => b.busy_slots));
      put(busy, window.QL3Charts.busyArea(d.buckets, d.capacity, {
        ariaLabel: t("chart_busy_label", { peak: peak, capacity: d.capacity }), tick: bucketTick(d.bucket_ms),
        title: (b) => t("bucket_busy", { from: absTime(b.start_ms), busy: b.busy_slots, capacity: d.capacity }),
        busyLabel: t("busy_legend"), capacityLabel: t("capacity_legend"),
      }));
    }).catch((e) => { if (current(mine)) put(day, el("p", { class: "muted", text: e.message || String(e) })); });
    return el("div", { class: "charts" },
      el("section", { "aria-labelledby": "ov-chart-24h" }, el("h2", { id: "ov-chart-24h", text: t("runs_per_hour") }), day),
      el("section", { "aria-labelledby": "ov-chart-7d" }, el("h2", { id: "ov-chart-7d", text: t("runs_per_6h") }), week),
      el("section", { "aria-labelledby": "ov-chart-busy" }, el("h2", { id: "ov-chart-busy", text: t("busy_slots") }), busy));
  }

  // --- extensions: pages that live in other files (admin.js) register here ---------------------------
  // A file loaded before this one pushes a setup function onto window.ql3Extensions; init() calls it
  // with these helpers before the first render. Its routes are #/NAME/...; its I18N keys merge in.
  const extensionPages = {};
  const extensionApi = {
    page: (name, fn) => { extensionPages[name] = fn; },
    i18n: (en, zh) => { Object.assign(I18N.en, en); Object.assign(I18N.zh, zh); },
    labels: (kind, en, zh) => { VALUE_LABELS.en[kind] = en; VALUE_LABELS.zh[kind] = zh; },
    t, lbl, el, put, link, badge, btn, short, enc, table, fields, when, say, fail, can, go, pp, get, post, request,
    current, setRefresh, confirmAction, ApiError, me, project: () => project(), lang: () => lang,
  };

  // --- theme: auto (the OS), light or dark, kept in prefs ----------------------------------------------
  const THEMES = ["auto", "light", "dark"];
  let theme = THEMES.includes(prefs.getItem("ql3.theme")) ? prefs.getItem("ql3.theme") : "auto";
  function applyTheme() {
    if (theme === "auto") delete document.documentElement.dataset.theme;
    else document.documentElement.dataset.theme = theme;
    const b = $("theme");
    b.textContent = t("theme_" + theme);
    b.setAttribute("aria-label", t("theme_label", { theme: t("theme_" + theme) }));
    b.dataset.theme = theme;
  }

  // --- chrome: language, time zone, menu, project, sign out ------------------------------------------
  function applyLanguage() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    for (const node of document.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
    const toggle = $("lang");
    toggle.textContent = lang === "zh" ? "English" : "中文";
    toggle.setAttribute("lang", lang === "zh" ? "en" : "zh");
    $("tz").setAttribute("aria-pressed", String(utc));
    $("tz").textContent = utc ? "UTC" : (lang === "zh" ? "本地时间" : "Local time");
    applyTheme();
    showIdentity();
  }

  function init() {
    // A token in the fragment (#token=...) is read once, kept in sessionStorage and removed from the URL.
    const frag = new URLSearchParams(location.hash.replace(/^#\/?/, ""));
    if (frag.has("token")) {
      session.setItem(TOKEN_KEY, frag.get("token"));
      session.removeItem(ME_KEY);
      history.replaceState(null, "", location.pathname + location.search + "#/");
    }
    $("lang").addEventListener("click", () => {
      lang = lang === "zh" ? "en" : "zh";
      prefs.setItem("ql3.lang", lang);
      applyLanguage();
      render();
    });
    $("tz").addEventListener("click", () => {
      utc = !utc;
      prefs.setItem("ql3.tz", utc ? "utc" : "local");
      applyLanguage();
      render();
    });
    $("menu").addEventListener("click", () => {
      const open = $("top").classList.toggle("open");
      $("menu").setAttribute("aria-expanded", String(open));
    });
    $("project").addEventListener("change", (e) => {
      session.setItem(PROJECT_KEY, e.target.value);
      me.role = null;
      go("#/");
      render();
    });
    $("signout").addEventListener("click", async () => {
      const csrfWas = token() ? "" : cookie.csrf;
      if (csrfWas) {
        cookie.csrf = ""; // signed out from here on: no refresh goes out with the session being revoked
        try { await request("DELETE", "/session", null, false, csrfWas); } catch (e) { if (e.status !== 401) fail(e); }
      }
      signedOut();
      $("approvals-badge").hidden = true;
      go("#/");
      render();
    });
    $("theme").addEventListener("click", () => {
      theme = THEMES[(THEMES.indexOf(theme) + 1) % THEMES.length];
      prefs.setItem("ql3.theme", theme);
      applyTheme();
    });
    for (const setup of window.ql3Extensions || []) setup(extensionApi);
    window.addEventListener("hashchange", render);
    refreshTimer = setInterval(tick, REFRESH_MS);
    applyLanguage();
    resumeSession().then(render);
  }

  init();
})();
