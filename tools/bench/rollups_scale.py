"""Rollup tables sized as 100M requests over 30 days of `tools.build_journal`'s traffic would
fill them, and `stats` read from them (no request rows: the rollups alone).

    python -m tools.bench.rollups_scale /tmp/sim.db [COMBINATIONS]

Day rows for the 30 days, hour rows for the last 48 hours, minute rows for two hours, each
combination of model, key, worker and outcome a row, each with its sketches filling as many
buckets as its values would (README, "Rollups and spend").
"""

import os
import random
import sys
import time
from datetime import datetime

from journal import rollups, schema, sketch
from journal.reader import JournalReader

path = sys.argv[1]
COMBOS = int(sys.argv[2]) if len(sys.argv) > 2 else 600
if os.path.exists(path):
    os.remove(path)
conn = schema.connect(path)
rng = random.Random(1)
models = ["claude-sonnet-4", "claude-haiku-4", "qwen3-8b"]
workers = [f"http://10.0.0.{n}:8000" for n in range(1, 5)]
keys = [f"{n:012x}" for n in range(20)]
combos = []
for k in keys:
    for m in models:
        for w in workers:
            for st, code, stop, stream, cut in (
                (200, None, "end_turn", 1, 0),
                (200, None, "end_turn", 0, 0),
                (529, "overloaded_error", None, 1, 0),
            ):
                combos.append((m, k, w, st, code, stop, stream, cut))
combos = combos[:COMBOS]
DAY0 = 1_750_032_000  # a UTC midnight
per_day = 100_000_000 // 30
cols = ", ".join(
    (
        "grain, ts, model, tenant, key_fp, worker, backend, status, error_code, error_type, stop_reason, stream",
        "hung_up, cut_mid_stream, requests, input_tokens, output_tokens, cost_usd, priced, duration_n, duration_sum",
        "ttfe_n, ttfe_sum, rated, rated_output, rated_ms, first_ts, last_ts, duration_max, ttfe_max",
    )
)
# The buckets a row's values fill (bounded by the value range, not by its count).
spans = {0: (20.0, 2300.0), 1: (20.0, 320.0), 2: (10.0, 1500.0)}


def sketches(n):
    for lo, hi in spans.values():
        b0, b1 = sketch.bucket(lo), sketch.bucket(hi)
        filled = min(b1 - b0 + 1, n)
        yield sketch.encode({b: max(1, n // filled) for b in range(b0, b0 + filled)})


def rows(grain, start, count, share):
    for i in range(count):
        ts = start + i * grain
        for c in combos:
            n = max(1, int(share / len(combos)))
            yield (
                grain,
                ts,
                c[0],
                None,
                c[1],
                c[2],
                "http",
                c[3],
                c[4],
                None if c[4] is None else "overloaded_error",
                c[5],
                c[6],
                0,
                c[7],
                n,
                40 * n,
                30 * n,
                0.0005 * n,
                n,
                n,
                1100.0 * n,
                n,
                170.0 * n,
                n,
                30 * n,
                1100.0 * n,
                ts,
                ts + grain - 1,
                2300.0,
                320.0,
            )


t = time.time()
conn.execute("BEGIN")
plan = [
    (86400, DAY0, 30, per_day),
    (3600, DAY0 + 28 * 86400, 48, per_day / 24),
    (60, DAY0 + 29 * 86400 + 11 * 3600, 120, per_day / 1440),
]
for grain, start, count, share in plan:
    conn.executemany(f"INSERT INTO rollups ({cols}) VALUES ({', '.join('?' * 30)})", rows(grain, start, count, share))
conn.executemany(
    f"INSERT INTO {rollups.SKETCHES_TABLE} VALUES (?, ?, ?, ?)",
    ((rid, *sketches(n)) for rid, n in conn.execute("SELECT rid, requests FROM rollups").fetchall()),
)
conn.execute("COMMIT")
counts = {g: conn.execute("SELECT count(*) FROM rollups WHERE grain = ?", (g,)).fetchone()[0] for g in rollups.GRAINS}
lengths = " + ".join(f"length({c})" for c in rollups.SKETCHES)
sk = conn.execute(f"SELECT sum({lengths}) FROM {rollups.SKETCHES_TABLE}").fetchone()[0] // 2**20
print(
    "built in",
    round(time.time() - t, 1),
    "s; rollup rows per grain (day tier whole 30 days; hours 48 h; minutes 2 h):",
    counts,
    "sketch MB:",
    sk,
    "file MB:",
    os.path.getsize(path) // 2**20,
)
conn.close()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts).isoformat()


for label, q, by, every in [
    ("stats (30 days)", "", None, None),
    ("stats --by model", "", "model", None),
    ("stats model:qwen3-8b", "model:qwen3-8b", None, None),
    ("stats --by key", "", "key", None),
    (
        "stats 36h range",
        f"since:{iso(DAY0 + 28 * 86400 + 12 * 3600 + 7.5)} until:{iso(DAY0 + 29 * 86400 + 12 * 3600 + 30)}",
        None,
        None,
    ),
]:
    best, cpu = [], []
    for _ in range(3):
        with JournalReader(path) as reader:
            t, c = time.perf_counter(), time.process_time()
            out = reader.stats(q) if by is None else reader.group_stats(q, by=by, every=every)
            best.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)  # what the machine's other load does not change
            n = out["requests"] if by is None else sum(r["requests"] for r in out)
            src = out.get("source") if by is None else reader.stats_source
    print(
        label,
        "first",
        round(best[0], 3),
        "median",
        round(sorted(best)[1], 3),
        "cpu median",
        round(sorted(cpu)[1], 3),
        "requests",
        n,
        src,
        flush=True,
    )
