// The console's pictures (docs/console.md "Pictures"): inline SVG built from data the API already
// aggregated, without a build step. Colours come from CSS classes (app.css: .c-STATUS, var(--ok)...)
// so dark mode and the theme follow; every chart scales to its box (viewBox, width 100%).
// app.js calls window.QL3Charts; nothing here talks to the server.
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  // Outcomes in stacking order (bottom first); anything else is drawn as "other".
  const OUTCOMES = ["succeeded", "failed", "timed_out", "cancelled"];
  const STRIP_RUNS = 50;

  function svg(tag, attrs, ...kids) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) node.setAttribute(k, String(v));
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined) continue;
      node.append(typeof kid === "string" ? document.createTextNode(kid) : kid);
    }
    return node;
  }

  function statusClass(status) { return "c-" + String(status || "other").replace(/[^a-z_]/g, ""); }

  // A task's recent runs, oldest left: one bar each, coloured by outcome, as tall as its duration
  // (relative to the longest shown; at least a sliver), each a link to the run with a tooltip.
  // runs: [{ href, status, duration_ms (null while unfinished), title }]
  function runStrip(runs, ariaLabel) {
    const bar = 10, gap = 3, height = 48;
    const longest = Math.max(1, ...runs.map((r) => (typeof r.duration_ms === "number" ? r.duration_ms : 0)));
    // room for a full strip (50 runs) whatever is shown, so bars keep their size
    const width = Math.max(runs.length, STRIP_RUNS) * (bar + gap) - gap;
    const root = svg("svg", { viewBox: "0 0 " + width + " " + height, class: "chart strip", role: "group",
      "aria-label": ariaLabel, preserveAspectRatio: "xMinYMax meet" });
    runs.forEach((r, i) => {
      const known = typeof r.duration_ms === "number";
      const h = known ? Math.max(4, Math.round((r.duration_ms / longest) * (height - 2))) : height - 2;
      root.append(svg("a", { href: r.href, "aria-label": r.title, class: "strip-run" },
        svg("title", {}, r.title),
        svg("rect", { x: i * (bar + gap), y: height - h, width: bar, height: h, rx: 1,
          class: "bar " + statusClass(r.status) + (known ? "" : " unfinished"), "data-status": r.status })));
    });
    return root;
  }

  function legend(items) {
    const ul = document.createElement("ul");
    ul.className = "legend";
    for (const [cls, text] of items) {
      const li = document.createElement("li");
      const sw = document.createElement("span");
      sw.className = "swatch " + cls;
      sw.setAttribute("aria-hidden", "true");
      li.append(sw, document.createTextNode(text));
      ul.append(li);
    }
    return ul;
  }

  function axis(root, { width, height, left, bottom, top, max, ticks }) {
    // y: 0 and max; x: the labels given at their bucket index
    root.append(svg("line", { x1: left, x2: width, y1: height - bottom, y2: height - bottom, class: "axis" }));
    root.append(svg("text", { x: left - 4, y: height - bottom, class: "tick", "text-anchor": "end" }, "0"));
    root.append(svg("text", { x: left - 4, y: top + 8, class: "tick", "text-anchor": "end" }, String(max)));
    for (const [x, text] of ticks) {
      root.append(svg("text", { x: x, y: height - 4, class: "tick", "text-anchor": "middle" }, text));
    }
  }

  // Runs per bucket stacked by outcome. buckets: [{ start_ms, counts: {status: n} }];
  // opts: { ariaLabel, label(status), tick(ms) -> text or null, title(bucket, total) -> text }
  function stackedBars(buckets, opts) {
    const width = 600, height = 170, left = 30, bottom = 18, top = 6;
    const totals = buckets.map((b) => Object.values(b.counts || {}).reduce((a, n) => a + n, 0));
    const max = Math.max(1, ...totals);
    const step = (width - left) / Math.max(1, buckets.length);
    const bar = Math.max(1, step * 0.75);
    const plot = height - bottom - top;
    const root = svg("svg", { viewBox: "0 0 " + width + " " + height, class: "chart bars", role: "img",
      "aria-label": opts.ariaLabel });
    const ticks = [];
    buckets.forEach((b, i) => {
      const x = left + i * step + (step - bar) / 2;
      const group = svg("g", { class: "bucket", "data-total": totals[i], "data-start": b.start_ms },
        svg("title", {}, opts.title(b, totals[i])));
      let y = height - bottom;
      const order = OUTCOMES.concat(Object.keys(b.counts || {}).filter((s) => !OUTCOMES.includes(s)).sort());
      for (const status of order) {
        const n = (b.counts || {})[status] || 0;
        if (!n) continue;
        const h = (n / max) * plot;
        y -= h;
        group.append(svg("rect", { x: x.toFixed(1), y: y.toFixed(1), width: bar.toFixed(1), height: h.toFixed(1),
          class: "bar " + statusClass(status), "data-status": status, "data-n": n }));
      }
      // an empty bucket still has a hover target for its tooltip
      group.prepend(svg("rect", { x: (left + i * step).toFixed(1), y: top, width: step.toFixed(1), height: plot, class: "hit" }));
      root.append(group);
      const text = opts.tick(b.start_ms, i);
      if (text) ticks.push([left + i * step + step / 2, text]);
    });
    axis(root, { width, height, left, bottom, top, max, ticks });
    const present = OUTCOMES.filter((s) => buckets.some((b) => (b.counts || {})[s]));
    return [root, legend(present.map((s) => [statusClass(s), opts.label(s)]))];
  }

  // Mean busy slots per bucket as an area, against today's capacity as a dashed line.
  // buckets: [{ start_ms, busy_slots }]; opts: { ariaLabel, tick(ms) -> text or null, title(bucket) -> text,
  // capacityLabel, busyLabel }
  function busyArea(buckets, capacity, opts) {
    const width = 600, height = 150, left = 30, bottom = 18, top = 6;
    const peak = Math.max(...buckets.map((b) => b.busy_slots || 0), 0);
    const max = Math.max(1, capacity, Math.ceil(peak));
    const step = (width - left) / Math.max(1, buckets.length);
    const plot = height - bottom - top;
    const yOf = (v) => (height - bottom - (v / max) * plot).toFixed(1);
    const root = svg("svg", { viewBox: "0 0 " + width + " " + height, class: "chart busy", role: "img",
      "aria-label": opts.ariaLabel });
    const ticks = [];
    buckets.forEach((b, i) => {
      const x = left + i * step;
      const v = b.busy_slots || 0;
      root.append(svg("g", { class: "bucket", "data-busy": v },
        svg("title", {}, opts.title(b)),
        svg("rect", { x: x.toFixed(1), y: top, width: step.toFixed(1), height: plot, class: "hit" }),
        v > 0 ? svg("rect", { x: (x + 0.5).toFixed(1), y: yOf(v), width: Math.max(1, step - 1).toFixed(1),
          height: ((v / max) * plot).toFixed(1), class: "area" }) : null));
      const text = opts.tick(b.start_ms, i);
      if (text) ticks.push([x + step / 2, text]);
    });
    if (capacity > 0) {
      root.append(svg("line", { x1: left, x2: width, y1: yOf(capacity), y2: yOf(capacity), class: "capacity" }));
    }
    axis(root, { width, height, left, bottom, top, max, ticks });
    return [root, legend([["sw-area", opts.busyLabel], ["sw-capacity", opts.capacityLabel]])];
  }

  window.QL3Charts = { runStrip: runStrip, stackedBars: stackedBars, busyArea: busyArea, OUTCOMES: OUTCOMES };
})();
