"""Turns the relay bench's raw runs into figures and rich tables.

A scenario is a mode (streaming or not) at one concurrency; each target ran ``reps`` times in
it, interleaved with the other targets. A figure is the median over the runs; its spread is
half the min-max range, as a share of the median. Ratios between two targets are taken run by
run (the runs of one round are neighbours in time) and shown as median [min-max].
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

Run = dict[str, Any]  # one load-generator result plus mode, concurrency, target, rep, pids


@dataclass(frozen=True)
class Target:
    """What a run was aimed at: the worker itself or a gateway configuration."""

    key: str
    label: str
    journal: bool | None = None  # None: the worker directly (or the reference gateway)
    transport: str | None = None
    reference: bool = False  # the reference gateway (Rust smg from PyPI, `--compare`)
    floor: bool = False  # the minimal relay on the same stack (`tools.bench.floor`)


DIRECT = Target("direct", "the worker directly")
REFERENCE = Target("ref", "the reference gateway (Rust smg from PyPI)", reference=True)
FLOOR = Target("floor", "a bare Sanic relay on the gateway's upstream session", floor=True)
TARGETS = (
    DIRECT,
    REFERENCE,
    FLOOR,
    Target("floor-httpx", "the floor through the httpx client on top", floor=True, transport="httpx"),
    Target("httpx+J", "gateway, httpx upstream, journal on", True, "httpx"),
    Target("httpx-J", "gateway, httpx upstream, --no-journal", False, "httpx"),
    Target("aiohttp+J", "gateway, aiohttp upstream, journal on", True, "aiohttp"),
    Target("aiohttp-J", "gateway, aiohttp upstream, --no-journal", False, "aiohttp"),
)
# Summary ratios: (column title, numerator key, denominator key, figure).
_RATIOS = (
    ("on/off aiohttp", "aiohttp+J", "aiohttp-J", "rps"),
    ("gwCPU on/off", "aiohttp+J", "aiohttp-J", "gw_cpu"),
    ("gwCPU +J/ref", "aiohttp+J", "ref", "gw_cpu"),
    ("gwCPU -J/ref", "aiohttp-J", "ref", "gw_cpu"),
    ("gwCPU +J/floor", "aiohttp+J", "floor", "gw_cpu"),
    ("gwCPU floor/ref", "floor", "ref", "gw_cpu"),
    ("rps +J/ref", "aiohttp+J", "ref", "rps"),
    ("rps +J/floor", "aiohttp+J", "floor", "rps"),
    ("on/off httpx", "httpx+J", "httpx-J", "rps"),
    ("rps h/a +J", "httpx+J", "aiohttp+J", "rps"),
    ("rps h/a -J", "httpx-J", "aiohttp-J", "rps"),
    ("gwCPU h/a +J", "httpx+J", "aiohttp+J", "gw_cpu"),
    ("gwCPU h/a -J", "httpx-J", "aiohttp-J", "gw_cpu"),
)
LEGEND = (
    "targets: direct = the worker itself; ref = the reference gateway; floor = a bare Sanic relay on the",
    "  gateway's upstream session (floor-httpx: through httpx on top); httpx/aiohttp = gateway with that",
    "  upstream transport; +J journal on, -J --no-journal",
    "columns: req/s ± spread; x-direct = req/s / direct's; p50 p90 p99 = latency ms (streams: to the last byte);",
    "  +p50 = p50 - direct's p50 (ms); ttfb = ms to the first body byte; gwCPU, wkCPU = gateway, worker CPU µs per",
    "  request (with its child processes); RSS = gateway MB resident at the end of the run; gen = load generator",
    "  CPU (near 100%: the generator is the limit); err = failed requests (non-200, broken stream, timeout)",
    "ratios, run by run, median [min-max]: on/off = req/s journal on / off; h/a = httpx / aiohttp, of req/s",
    "  (below 1: httpx slower) or of gateway CPU per request (above 1: httpx costs more); /ref = this gateway",
    "  (aiohttp upstream) against the reference gateway (ref, with --compare); /floor = against the floor",
)


def scenario_name(stream: bool, concurrency: int) -> str:
    return f"{'stream' if stream else 'json'} c={concurrency}"


def _figure(run: Run, name: str) -> float | None:
    """One named figure of a run (latencies in ms, CPU in microseconds per request)."""
    if name == "rps":
        return float(run["rps"])
    if name in ("gw_cpu", "wk_cpu", "gw_rss"):
        pid = run.get("worker_pid" if name == "wk_cpu" else "gateway_pid")
        group_name = "rss_mb" if name == "gw_rss" else "cpu_us_per_request"
        value = run.get(group_name, {}).get(str(pid)) if pid else None
        return float(value) if value is not None else None
    group, _, q = name.partition(".")
    value = run.get(group, {}).get(q)
    return float(value) if value is not None else None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _spread(values: Sequence[float]) -> float | None:
    if len(values) < 2 or not statistics.median(values):
        return None
    return (max(values) - min(values)) / 2 / statistics.median(values)


@dataclass
class Cell:
    """A target's runs in one scenario."""

    runs: list[Run]

    def median(self, name: str) -> float | None:
        return _median(_figure(r, name) for r in self.runs)

    def spread(self, name: str) -> float | None:
        return _spread([v for r in self.runs if (v := _figure(r, name)) is not None])

    @property
    def errors(self) -> int:
        return sum(r["errors"] for r in self.runs)

    @property
    def warmup_errors(self) -> int:
        return sum(r.get("warmup", {}).get("errors", 0) for r in self.runs)


def group(runs: list[Run]) -> dict[tuple[bool, int], dict[str, Cell]]:
    """Runs by scenario (stream, concurrency), then by target key, in the order they ran."""
    out: dict[tuple[bool, int], dict[str, Cell]] = defaultdict(dict)
    for run in runs:
        cells = out[(run["stream"], run["concurrency"])]
        cells.setdefault(run["target"], Cell([])).runs.append(run)
    return out


def paired_ratio(cells: dict[str, Cell], num: str, den: str, name: str) -> tuple[float, float, float] | None:
    """Run-by-run ratio num/den of a figure: (median, min, max), or None when either is missing."""
    if num not in cells or den not in cells:
        return None
    by_rep = {r["rep"]: _figure(r, name) for r in cells[den].runs}
    ratios = [
        a / b
        for r in cells[num].runs
        if (a := _figure(r, name)) is not None and (b := by_rep.get(r["rep"])) not in (None, 0.0)
    ]
    return (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None


def summary(runs: list[Run]) -> dict[str, Any]:
    """Aggregated figures and ratios per scenario, for the JSON file."""
    out: dict[str, Any] = {}
    names = ("rps", "latency_ms.p50", "latency_ms.p90", "latency_ms.p99", "ttfb_ms.p50", "ttfb_ms.p99")
    for (stream, conc), cells in group(runs).items():
        entry: dict[str, Any] = {"targets": {}, "ratios": {}}
        for key, cell in cells.items():
            figures: dict[str, Any] = {n: cell.median(n) for n in (*names, "gw_cpu", "wk_cpu", "gw_rss")}
            figures.update(rps_spread=cell.spread("rps"), errors=cell.errors, warmup_errors=cell.warmup_errors)
            entry["targets"][key] = figures
        for _, num, den, name in _RATIOS:
            entry["ratios"][f"{num}/{den} {name}"] = paired_ratio(cells, num, den, name)
        out[scenario_name(stream, conc)] = entry
    return out


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+,.2f}"


def _ratio(value: tuple[float, float, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value[0]:.2f}" if value[1] == value[2] else f"{value[0]:.2f} [{value[1]:.2f}-{value[2]:.2f}]"


def _errors(cell: Cell) -> Text:
    text = str(cell.errors) + (f" (+{cell.warmup_errors} warm)" if cell.warmup_errors else "")
    return Text(text, style="bold red" if cell.errors or cell.warmup_errors else "")


def _table(first: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), header_style="bold")
    table.add_column(first, no_wrap=True)
    return table


def scenario_table(stream: bool, concurrency: int, cells: dict[str, Cell]) -> Table:
    """One scenario: a row per target; the scenario's name heads the first column."""
    table = _table(scenario_name(stream, concurrency))
    direct = cells.get(DIRECT.key)
    d_rps = direct.median("rps") if direct else None
    d_p50 = direct.median("latency_ms.p50") if direct else None

    def rps(c: Cell) -> str:
        spread = c.spread("rps")
        return _num(c.median("rps"), 0) + (f" ±{spread:.0%}" if spread is not None else "")

    def vs_direct(c: Cell) -> str:
        value = c.median("rps")
        return "-" if value is None or not d_rps else f"{value / d_rps:.3f}"

    def added(c: Cell) -> str:
        value = c.median("latency_ms.p50")
        return "-" if value is None or d_p50 is None else _signed(value - d_p50)

    def figure(name: str, digits: int = 2) -> Callable[[Cell], str]:
        return lambda c: _num(c.median(name), digits)

    columns: list[tuple[str, Callable[[Cell], str | Text]]] = [("req/s", rps), ("x-direct", vs_direct)]
    columns += [(q, figure(f"latency_ms.{q}")) for q in ("p50", "p90", "p99")]
    columns += [("+p50", added)]
    if stream:
        columns += [(f"ttfb{q[1:]}", figure(f"ttfb_ms.{q}")) for q in ("p50", "p99")]
    columns += [
        ("gwCPU", figure("gw_cpu", 0)),
        ("wkCPU", figure("wk_cpu", 0)),
        ("RSS", figure("gw_rss", 0)),
        ("gen", lambda c: _num(_median(r["generator_cpu"] * 100 for r in c.runs), 0) + "%"),
        ("err", _errors),
    ]
    for title, _ in columns:
        table.add_column(title, justify="right")
    for target in TARGETS:
        cell = cells.get(target.key)
        if cell is not None:
            table.add_row(target.key, *(fn(cell) for _, fn in columns))
    return table


def ratio_table(grouped: dict[tuple[bool, int], dict[str, Cell]]) -> Table:
    """Journal on/off and httpx/aiohttp ratios per scenario, run by run: median [min-max].

    On req/s below 1 means the first is slower; on CPU per request above 1 means it costs more."""
    table = _table("ratios")
    shown = [r for r in _RATIOS if any(paired_ratio(cells, *r[1:]) for cells in grouped.values())]
    for title, *_ in shown:
        table.add_column(title, justify="right")
    for (stream, conc), cells in grouped.items():
        table.add_row(scenario_name(stream, conc), *(_ratio(paired_ratio(cells, n, d, f)) for _, n, d, f in shown))
    return table


def render(console: Console, header: list[str], runs: list[Run]) -> None:
    for line in header:
        console.print(line, highlight=False)
    for line in LEGEND:
        console.print(line, highlight=False, markup=False)
    grouped = group(runs)
    for (stream, conc), cells in grouped.items():
        console.print(scenario_table(stream, conc, cells))
    console.print(ratio_table(grouped))
    failed = [r for r in runs if r["errors"] or r.get("warmup", {}).get("errors")]
    for run in failed:
        samples = run["error_samples"] + run.get("warmup", {}).get("error_samples", [])
        console.print(
            f"[bold red]errors[/] {scenario_name(run['stream'], run['concurrency'])}, {run['target']} "
            f"(run {run['rep'] + 1}): {run['error_kinds']} warm-up {run.get('warmup', {}).get('error_kinds', {})}",
            highlight=False,
        )
        for sample in samples[:3]:
            console.print(f"    {sample}", highlight=False, markup=False)
