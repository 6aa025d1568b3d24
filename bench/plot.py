"""Plots runs/s per system from one ``bench/run-all`` session: ``bench/throughput.png``.

    .venv/bin/python bench/plot.py [--ql3 bench/results/ql3.json] [--peers bench/results/peers.json]
                                   [--cluster bench/results/cluster.json] [--out bench/throughput.png]

Left: end-to-end runs (jobs) per second of ``true`` for ql3 on SQLite and PostgreSQL and for the
peers, with the backlog enqueued first and with a live producer. Right: ql3 with ``--slots`` 1, 8
and 64, and with 1,000 versus 100,000 queued runs. Third, when ``bench/cluster_bench.py`` ran in the
session: cluster mode (one ``ql3 control`` and two ``ql3 worker``s) beside procrastinate and pgqueuer
at the same concurrency on the same PostgreSQL server, with each system's committed transactions per
run. matplotlib is a bench-only dependency (the
``bench`` extra of pyproject.toml), never part of a served install.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]


def systems(ql3: dict[str, Any], peers: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(label, backlog runs/s, live runs/s) per system."""
    rows: list[tuple[str, float | None, float | None]] = []
    for kind, label in (("sqlite", "ql3 serve\nSQLite"), ("postgres", "ql3 serve\nPostgreSQL")):
        e2e = ql3.get(f"e2e_{kind}")
        if e2e:
            rows.append((label, e2e["backlog"]["runs_per_s"], e2e["live"]["runs_per_s"]))
    for peer in peers.get("peers", []):
        storage = "SQLite" if peer["storage"].startswith("SQLite") else "PostgreSQL"
        rows.append(
            (f"{peer['name']}\n{storage}", peer["median_jobs_per_s"], peer.get("median_live_jobs_per_s"))
        )
    return rows


def _med(runs: list[dict[str, Any]], key: str) -> float | None:
    values = sorted(r[key] for r in runs if r.get(key) is not None)
    return values[(len(values) - 1) // 2] if values else None


def _f(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table(ql3: dict[str, Any], peers: dict[str, Any]) -> str:
    """The summary table (markdown) of one session: ql3 and the peers side by side."""
    head = (
        "| system | storage | backlog runs/s | live-producer runs/s | idle start p50 / p99 ms |"
        " CPU ms/run, process / +children (live) | transactions/run (live) | fsyncs/run (live) |"
        " peak RSS MiB |\n| --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: |"
    )
    lines = [head]
    for kind, storage in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
        e2e = ql3.get(f"e2e_{kind}")
        if not e2e:
            continue
        back, live, lat = e2e["backlog"], e2e["live"], e2e["latency"]
        tx = f"{live['transactions_per_run']:.2f}"
        if "pg_xact_commit_per_run" in live:
            tx += f" (xact_commit {live['pg_xact_commit_per_run']:.2f})"
        fs = f"{live['fsyncs_per_run']:.2f}"
        if "journal_fsyncs_per_run" in live:
            fs += f" (+ journal {live['journal_fsyncs_per_run']:.2f})"
        lines.append(
            f"| ql3 `serve` | {storage} | {back['runs_per_s']:.1f} | {live['runs_per_s']:.1f} |"
            f" {lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} |"
            f" {live['cpu_ms_per_run_server']:.2f} / {live['cpu_ms_per_run_with_children']:.2f} |"
            f" {tx} | {fs} | {max(back['peak_rss_mb'], live['peak_rss_mb']):.1f} |"
        )
    for peer in peers.get("peers", []):
        live_runs = peer.get("live", [])
        lat = peer.get("latency") or {}
        version = peers.get("machine", {}).get("packages", {}).get(peer["name"], "")
        cpu_self = _f(_med(live_runs, "cpu_ms_per_job"), ".2f")
        cpu = f"{cpu_self} / {_f(_med(live_runs, 'cpu_ms_per_job_with_children'), '.2f')}"
        xact, wal = _med(live_runs, "xact_per_job"), _med(live_runs, "wal_sync_per_job")
        rss = peer["peak_rss_kib"] / 1024 if peer.get("peak_rss_kib") else None
        lines.append(
            f"| {peer['name']} {version} | {peer['storage']} | {_f(peer['median_jobs_per_s'])} |"
            f" {_f(peer.get('median_live_jobs_per_s'))} |"
            f" {_f(lat.get('p50_ms'), '.2f')} / {_f(lat.get('p99_ms'), '.2f')} | {cpu} |"
            f" {_f(xact, '.2f')} | {_f(wal, '.2f')} |"
            f" {_f(rss)} |"
        )
    lines += ["", "| ql3 | storage | --slots 1 | --slots 8 | --slots 64 | small backlog | large backlog |"
              " ratio (sizes) | server CPU a run, ratio |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for kind, storage in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
        e2e = ql3.get(f"e2e_{kind}")
        if not e2e:
            continue
        slots = [_f(e2e["slots"].get(k, {}).get("runs_per_s")) for k in ("1", "8", "64")]
        flat = e2e.get("flat", {})
        sizes = sorted(int(k) for k in flat if k.isdigit())
        pair = [_f(flat[str(k)]["runs_per_s"]) for k in sizes] if len(sizes) == 2 else ["-", "-"]
        label = f"{sizes[0]} / {sizes[1]} queued" if len(sizes) == 2 else ""
        lines.append(
            f"| ql3 `serve` | {storage} | {' | '.join(slots)} | {' | '.join(pair)} |"
            f" {_f(flat.get('ratio'), '.3f')} {label} | {_f(flat.get('cpu_ratio'), '.3f')} |"
        )
    lines.append("")
    lines.append(
        f"dispatch_once: {ql3.get('dispatch_offers_per_s_sqlite', '-')} offers/s SQLite,"
        f" {ql3.get('dispatch_offers_per_s_postgres', '-')} PostgreSQL"
        f" ({ql3.get('pg_round_trips_per_offer', '-')} round trips per offer)."
        f" Load average (1 min): {ql3.get('load_1m_start', '?')} at the start,"
        f" {round(float(peers.get('loadavg_after', [0])[0]), 1)} at the end."
    )
    return "\n".join(lines)


def cluster_rows(cluster: dict[str, Any]) -> list[tuple[str, float | None, float | None, float | None]]:
    """(label, runs/s, transactions/run, idle p50 ms) for ql3 in cluster mode and the peers it ran
    beside (bench/cluster_bench.py)."""
    rows: list[tuple[str, float | None, float | None, float | None]] = []
    for conf in cluster.get("ql3", []):
        thr, idle = conf.get("throughput") or {}, conf.get("idle_created_to_started_ms") or {}
        label = f"ql3 cluster\n{conf['replicas']} control + {conf['workers']} workers"
        rows.append((label, thr.get("runs_per_s"), thr.get("db_transactions_per_run"), idle.get("p50")))
    for name, peer in (cluster.get("peers") or {}).items():
        rows.append(
            (name, peer.get("jobs_per_s"), peer.get("db_transactions_per_job"), peer.get("idle_p50_ms"))
        )
    return rows


def cluster_table(cluster: dict[str, Any]) -> str:
    """The cluster-mode table (markdown): runs/s, transactions per run and idle start p50."""
    lines = [
        "| cluster mode, same PostgreSQL server | runs/s | transactions/run | idle start p50 ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, rate, tx, p50 in cluster_rows(cluster):
        lines.append(f"| {label.replace(chr(10), ' ')} | {_f(rate)} | {_f(tx)} | {_f(p50, '.2f')} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ql3", type=Path, default=ROOT / "bench/results/ql3.json")
    parser.add_argument("--peers", type=Path, default=ROOT / "bench/results/peers.json")
    parser.add_argument("--cluster", type=Path, default=ROOT / "bench/results/cluster.json")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/throughput.png")
    parser.add_argument("--table", type=Path, default=None, help="also write the summary table (markdown)")
    args = parser.parse_args()
    ql3 = json.loads(args.ql3.read_text())
    peers = json.loads(args.peers.read_text()) if args.peers.exists() else {}
    cluster = json.loads(args.cluster.read_text()) if args.cluster.exists() else {}
    rows = systems(ql3, peers)
    crows = cluster_rows(cluster)

    if crows:
        fig, (left, right, third) = plt.subplots(
            1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [3, 2, 1.4]}
        )
        cbars = third.bar(range(len(crows)), [r[1] or 0.0 for r in crows], color="#c44e52")
        third.bar_label(
            cbars,
            labels=[f"{r[1] or 0:.0f}\n{_f(r[2])} tx/run" for r in crows],
            fontsize=8,
        )
        third.set_ylim(top=max([r[1] or 0.0 for r in crows] + [1.0]) * 1.25)  # room for the labels
        third.set_xticks(range(len(crows)), [r[0] for r in crows], fontsize=8)
        third.set_title("cluster mode, same PostgreSQL server", fontsize=10)
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.38
    xs = range(len(rows))
    for offset, index, label, color in ((-width / 2, 1, "backlog enqueued first", "#4c72b0"),
                                         (width / 2, 2, "live producer", "#dd8452")):  # fmt: skip
        values = [r[index] or 0.0 for r in rows]
        bars = left.bar([x + offset for x in xs], values, width, label=label, color=color)
        left.bar_label(bars, labels=[f"{v:.0f}" if v else "-" for v in values], fontsize=8)
    left.set_xticks(list(xs), [r[0] for r in rows], fontsize=9)
    left.set_ylabel("runs (jobs) of `true` per second")
    left.set_title("end to end, one real process per run")
    left.legend(fontsize=9)

    labels: list[str] = []
    values: list[float] = []
    colors: list[str] = []
    for kind, color in (("sqlite", "#55a868"), ("postgres", "#8172b2")):
        e2e = ql3.get(f"e2e_{kind}")
        if not e2e:
            continue
        for slots in ("1", "8", "64"):
            if slots in e2e.get("slots", {}):
                labels.append(f"{slots}\nslots")
                values.append(e2e["slots"][slots]["runs_per_s"])
                colors.append(color)
        for queued, run in e2e.get("flat", {}).items():
            if queued.isdigit():
                labels.append(f"{int(queued) / 1000:g}k\nqueued")
                values.append(run["runs_per_s"])
                colors.append(color)
    bars = right.bar(range(len(values)), values, color=colors)
    right.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=8)
    right.set_xticks(range(len(values)), labels, fontsize=8)
    right.set_title("ql3 serve: --slots; runs/s with a small and a large backlog")
    from matplotlib.patches import Patch

    right.legend(
        handles=[Patch(color="#55a868", label="SQLite"), Patch(color="#8172b2", label="PostgreSQL")],
        fontsize=9,
    )
    load = round(float(peers.get("loadavg_after", [ql3.get("load_1m_end", 0)])[0]), 1)
    fig.suptitle(f"ql3 and peers, one bench/run-all session ({ql3.get('date', '')}; 2 shared vCPUs,"
                 f" load average about {load})", fontsize=10)  # fmt: skip
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")
    summary = table(ql3, peers)
    if crows:
        summary += "\n\n" + cluster_table(cluster)
    print(summary)
    if args.table:
        args.table.write_text(summary + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
