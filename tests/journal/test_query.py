"""The query language: examples, errors, and property tests against a plain Python filter.

The property tests build a real journal (the real schema, in a SQLite file) from random rows
and events, generate random queries as syntax trees, render them to text, and check that the
SQL `compile_query` gives selects exactly the rows that `matches` below (a direct reading of
the documented semantics) selects.
"""

from __future__ import annotations

import re
import sqlite3
import tempfile
import unicodedata
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import schema, search
from journal.query import FIELDS, QueryError, compile_query
from journal.reader import JournalReader

NOW = 1_750_000_000.0

# -- a journal from rows -----------------------------------------------------------------


@dataclass
class Row:
    values: dict[str, Any]  # requests columns
    events: list[tuple[str, str]]  # (kind, data JSON)


_TEMPLATE: bytes | None = None


def _empty_journal() -> bytes:
    """The bytes of a new, migrated journal (made once; copying it is much faster than migrating)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "template.db"
            schema.connect(path).close()  # the last connection checkpoints the WAL into the file
            _TEMPLATE = path.read_bytes()
    return _TEMPLATE


@contextmanager
def journal_of(rows: list[Row]) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "j.db"
        path.write_bytes(_empty_journal())
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("BEGIN")
            for row in rows:
                cols = list(row.values)
                rk = conn.execute(
                    f"INSERT INTO requests ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [row.values[c] for c in cols],
                ).lastrowid
                conn.executemany(
                    "INSERT INTO events VALUES (?, ?, ?, 0.0, ?)",
                    [(rk, seq, kind, data) for seq, (kind, data) in enumerate(row.events, 1)],
                )
                # The text index holds the searched events' text, as the writer gathers it.
                search.write_text(conn, [(rk, indexed_text(row))])
            conn.execute("COMMIT")
        finally:
            conn.close()
        yield path


def strings(value: Any) -> list[str]:
    """Every string in a JSON value, strings that hold JSON looked into too."""
    if isinstance(value, str):
        try:
            inner = orjson.loads(value)
        except orjson.JSONDecodeError:
            return [value]
        return strings(inner) if isinstance(inner, dict | list) else [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in strings(v)]
    if isinstance(value, list):
        return [t for v in value for t in strings(v)]
    return []


def indexed_text(row: Row) -> str:
    return "\n".join(t for kind, data in row.events if kind in SEARCHED for t in strings(orjson.loads(data)))


def select_ids(journal: Path | sqlite3.Connection, query: str, now: float = NOW, *, indexed: bool = False) -> set[str]:
    """The ids `query` selects; a property test passes one open connection for all its queries
    (opening one parses the journal's whole schema, its triggers included, each time)."""
    where, params = compile_query(query, now=now, indexed=indexed)
    sql = f"SELECT id FROM requests WHERE {where}"
    if isinstance(journal, sqlite3.Connection):
        return {r[0] for r in journal.execute(sql, params)}
    with closing(sqlite3.connect(journal)) as conn:
        return {r[0] for r in conn.execute(sql, params)}


# -- the reference semantics, in Python ---------------------------------------------------

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    return text.translate(_ASCII_LOWER)


def glob_matches(pattern: str, value: str) -> bool:
    regex = ".*".join(re.escape(part) for part in ascii_lower(pattern).split("*"))
    return re.fullmatch(regex, ascii_lower(value), re.DOTALL) is not None


STRING_COLUMNS = {
    "model": "model",
    "backend": "backend",
    "worker": "worker",
    "tenant": "tenant",
    "path": "path",
    "code": "error_code",
    "type": "error_type",
    "stop": "stop_reason",
    "client_id": "client_id",
    "user": "user_id",
    "session": "session_id",
    "key": "key_fp",
    "thread": "thread_key",
    "replica": "replica",  # a file names no replica: None in every row here
}
NUMBER_COLUMNS = {
    "status": "status",
    "ttft": "ttfe_ms",
    "ttfe": "ttfe_ms",
    "dur": "duration_ms",
    "in": "input_tokens",
    "out": "output_tokens",
    "turns": "turns",
    "cost": "cost_usd",
}
UNITS = {"": 1.0, "ms": 1.0, "s": 1000.0, "m": 60000.0, "h": 3600000.0}
AGO = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
FLAG_COLUMNS = {"hung_up": "hung_up", "cut": "cut_mid_stream"}
SEARCHED = {"received", "upstream", "block", "error", "rejected"}


def compare(left: float, op: str, right: float) -> bool:
    return {
        "=": left == right,
        "!=": left != right,
        ">": left > right,
        ">=": left >= right,
        "<": left < right,
        "<=": left <= right,
    }[op]


def number_of(field: str, value: str) -> float:
    match = re.fullmatch(r"([\d.]+)([a-zA-Z]*)", value.removeprefix("$"))
    assert match
    number, unit = float(match.group(1)), match.group(2)
    if field in ("ttft", "ttfe", "dur"):
        return number * UNITS[unit]
    return number * (1000 if unit == "k" else 1)


def moment(value: str) -> float:
    match = re.fullmatch(r"(\d+)([smhdw])", value)
    if match:
        return NOW - int(match.group(1)) * AGO[match.group(2)]
    return datetime.fromisoformat(value).timestamp()


def term_matches(row: Row, field: str, op: str, value: str) -> bool:
    op = op or "="
    v = row.values
    if field in STRING_COLUMNS:
        actual = v.get(STRING_COLUMNS[field])
        if actual is None:
            return False
        hit = glob_matches(value, actual) if "*" in value else actual == value
        return hit if op == "=" else not hit
    if field == "trace":  # the indexed column, filled from the `received` event's trace id
        return v.get("trace_id") is not None and v["trace_id"] == value.lower()
    if field == "id":  # the gateway's id or the client's
        ids = [i for i in (v["id"], v.get("client_id")) if i is not None]
        return any(glob_matches(value, i) if "*" in value else i.startswith(value) for i in ids)
    if field in NUMBER_COLUMNS:
        actual = v.get(NUMBER_COLUMNS[field])
        if actual is None:
            return False
        klass = re.fullmatch(r"([1-9])xx", value, re.IGNORECASE)
        if field == "status" and klass:
            inside = int(klass.group(1)) * 100 <= actual < int(klass.group(1)) * 100 + 100
            return inside if op == "=" else not inside
        return compare(actual, op, number_of(field, value))
    if field == "has":
        if value == "error":
            return (v.get("status") or 0) >= 400 or v.get("error_type") is not None or v.get("error_code") is not None
        return bool(v.get(FLAG_COLUMNS.get(value, f"has_{value}")))
    if field in ("stream", *FLAG_COLUMNS):
        return v.get(FLAG_COLUMNS.get(field, field)) == (1 if value in ("yes", "true") else 0)
    if field == "replay":
        return (v.get("replay_of") is not None) == (value in ("yes", "true"))
    ts: float | None = v.get("ts")
    if ts is None:
        return False
    return ts >= moment(value) if field == "since" else ts < moment(value)


def words(text: str) -> list[str]:
    """Words as the index's unicode61 tokenizer (remove_diacritics 2) sees them."""
    folded = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if not unicodedata.combining(c))
    return re.findall(r"[^\W_]+", folded)


def indexed_matches(row: Row, text: str, quoted: bool) -> bool:
    doc, phrase = words(indexed_text(row)), words(text)
    if not phrase:
        return text_matches(row, text)  # no word to look up: the query scans, as on an older file
    n = len(phrase)
    for i in range(len(doc) - n + 1):
        head, last = doc[i : i + n - 1], doc[i + n - 1]
        if head == phrase[:-1] and (last == phrase[-1] or (not quoted and last.startswith(phrase[-1]))):
            return True
    return False


def text_matches(row: Row, text: str) -> bool:
    needle = ascii_lower(orjson.dumps(text).decode()[1:-1])
    return any(kind in SEARCHED and needle in ascii_lower(data) for kind, data in row.events)


# -- query trees --------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    field: str
    alts: tuple[tuple[str, str], ...]  # (op, value): `field:a|b` when more than one


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Not:
    item: Any


@dataclass(frozen=True)
class Group:
    op: str  # "and" | "or"
    items: tuple[Any, ...]


@dataclass(frozen=True)
class Paren:
    item: Any


def evaluate(node: Any, row: Row, indexed: bool = False) -> bool:
    if isinstance(node, Term):
        return any(term_matches(row, node.field, op, value) for op, value in node.alts)
    if isinstance(node, Text):
        if indexed:
            return indexed_matches(row, node.text, quoted=not bare_ok(node.text))
        return text_matches(row, node.text)
    if isinstance(node, Not):
        return not evaluate(node.item, row, indexed)
    if isinstance(node, Paren):
        return evaluate(node.item, row, indexed)
    results = [evaluate(item, row, indexed) for item in node.items]
    return all(results) if node.op == "and" else any(results)


_SPECIAL = re.compile(r'[\s()|"]')


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bare_ok(text: str) -> bool:
    return bool(text) and not _SPECIAL.search(text) and text[0] not in "!=<>" and not re.match(r"[A-Za-z_]+:", text)


def render(node: Any) -> str:
    if isinstance(node, Term):
        parts = []
        for i, (op, value) in enumerate(node.alts):
            shown = value if bare_ok(value) else quote(value)
            parts.append(f"{node.field}:{op}{shown}" if i == 0 else f"{op}{shown}")
        return "|".join(parts)
    if isinstance(node, Text):
        return node.text if bare_ok(node.text) else quote(node.text)
    if isinstance(node, Paren):
        return f"({render(node.item)})"
    if isinstance(node, Not):
        inner = node.item
        return "!" + (f"({render(inner)})" if isinstance(inner, Group) else render(inner))
    if node.op == "and":
        return " ".join(f"({render(i)})" if isinstance(i, Group) and i.op == "or" else render(i) for i in node.items)
    return " | ".join(render(i) for i in node.items)


# -- strategies ---------------------------------------------------------------------------

WORDS = [
    "claude-x",
    "Claude-X",
    "claude-y",
    "qwen",
    "a%b",
    "a_b",
    "axb",
    "back\\slash",
    'quo"te',
    "it's",
    "two words",
    "é",
    "É",
    "x*y",
    "end_turn",
    "max_tokens",
    "tool_use",
    "http://127.0.0.1:8000",
    "/v1/messages",
    "(paren)",
    "a|b",
    "!bang",
    "=eq",
]
STATUSES = [None, 200, 400, 404, 429, 499, 500, 503, 529]
DURATIONS = [None, 0.0, 0.5, 999.0, 1000.0, 1500.0, 2000.0, 60000.0, 90000.0]
TOKENS = [None, 0, 1, 999, 1000, 1500, 12000]
AGES = [None, 10.0, 100.0, 1000.0, 3600.0, 86400.0, 100000.0]
TRACES = ["4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"]
KINDS = ["received", "upstream", "block", "error", "rejected", "tokens", "validated"]

maybe_word = st.one_of(st.none(), st.sampled_from(WORDS))


@st.composite
def rows(draw: st.DrawFn) -> list[Row]:
    count = draw(st.integers(0, 12))
    out = []
    for i in range(count):
        prefix = draw(st.sampled_from(["req_a", "req_ab", "REQ_a", "msg_", "x%_"]))
        age = draw(st.sampled_from(AGES))
        values: dict[str, Any] = {
            "id": f"{prefix}{i}",
            "ts": None if age is None else NOW - age,
            "path": draw(maybe_word),
            "client_id": draw(maybe_word),
            "tenant": draw(maybe_word),
            "model": draw(maybe_word),
            "backend": draw(maybe_word),
            "worker": draw(maybe_word),
            "stream": draw(st.sampled_from([None, 0, 1])),
            "status": draw(st.sampled_from(STATUSES)),
            "error_code": draw(maybe_word),
            "error_type": draw(maybe_word),
            "stop_reason": draw(maybe_word),
            "input_tokens": draw(st.sampled_from(TOKENS)),
            "output_tokens": draw(st.sampled_from(TOKENS)),
            "ttfe_ms": draw(st.sampled_from(DURATIONS)),
            "duration_ms": draw(st.sampled_from(DURATIONS)),
            "replay_of": draw(st.sampled_from([None, "req_a0"])),
            "completed": draw(st.sampled_from([0, 1])),
            "has_tool_use": draw(st.sampled_from([0, 1])),
            "has_thinking": draw(st.sampled_from([0, 1])),
            "trace_id": draw(st.sampled_from([None, *TRACES])),
            "user_id": draw(maybe_word),
            "session_id": draw(maybe_word),
            "key_fp": draw(st.sampled_from([None, "0f2c10bf3d12", "a1b2c3d4e5f6"])),
            "thread_key": draw(maybe_word),
            "turns": draw(st.sampled_from([None, 0, 1, 3, 12])),
            "hung_up": draw(st.sampled_from([0, 1])),
            "cut_mid_stream": draw(st.sampled_from([0, 1])),
            "cost_usd": draw(st.sampled_from([None, 0.0, 0.004, 1.25])),
        }
        events = [
            (
                draw(st.sampled_from(KINDS)),
                orjson.dumps(
                    {
                        "text": " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=3))),
                        "trace_id": draw(st.sampled_from([None, *TRACES])),
                    }
                ).decode(),
            )
            for _ in range(draw(st.integers(0, 3)))
        ]
        out.append(Row(values, events))
    return out


@st.composite
def glob(draw: st.DrawFn) -> str:
    word = draw(st.sampled_from(WORDS))
    i = draw(st.integers(0, len(word)))
    j = draw(st.integers(i, len(word)))
    return word[:i] + "*" + word[j:]


@st.composite
def term(draw: st.DrawFn) -> Term:
    field = draw(st.sampled_from(FIELDS))
    n = draw(st.integers(1, 3)) if field not in ("since", "until") else 1
    alts = []
    for i in range(n):
        op = ""
        if field == "key":
            value = draw(st.sampled_from(["0f2c10bf3d12", "0f2c*", "*d12", "a1b2c3d4e5f6"]))
            op = draw(st.sampled_from(["", "=", "!="]))
        elif field in STRING_COLUMNS:
            value = draw(st.one_of(st.sampled_from(WORDS), glob()))
            op = draw(st.sampled_from(["", "=", "!="]))
            if i > 0 and not bare_ok(value):
                op = ""  # an alternative that needs quotes takes no operator
        elif field == "id":
            value = draw(st.sampled_from(["req_a", "req_", "req_ab", "REQ", "req_a1", "x%_", "req*1", "*a*", "msg_0"]))
        elif field == "status":
            value = draw(st.sampled_from(["200", "400", "499", "500", "529", "4xx", "5xx", "2XX"]))
            ops = ["", "=", "!="] if "x" in value.lower() else ["", "=", "!=", ">", ">=", "<", "<="]
            op = draw(st.sampled_from(ops))
        elif field in ("ttft", "ttfe", "dur"):
            value = draw(st.sampled_from(["0", "0.5", "999", "1000ms", "1s", "1.5s", "2s", "1m", "1.5m", "2000"]))
            op = draw(st.sampled_from(["", "=", "!=", ">", ">=", "<", "<="]))
        elif field == "turns":
            value = draw(st.sampled_from(["0", "1", "3", "12"]))
            op = draw(st.sampled_from(["", "=", "!=", ">", ">=", "<", "<="]))
        elif field == "cost":
            value = draw(st.sampled_from(["0", "0.004", "$1", "1.25", "$0.5", "2"]))
            op = draw(st.sampled_from(["", "=", "!=", ">", ">=", "<", "<="]))
        elif field in ("in", "out"):
            value = draw(st.sampled_from(["0", "1", "999", "1000", "1k", "1.5k", "12k", "12000"]))
            op = draw(st.sampled_from(["", "=", "!=", ">", ">=", "<", "<="]))
        elif field == "has":
            value = draw(st.sampled_from(["tool_use", "thinking", "error", "hung_up", "cut"]))
        elif field == "trace":
            value = draw(st.sampled_from([*TRACES, TRACES[0].upper()]))
        elif field in ("stream", "replay", "hung_up", "cut"):
            value = draw(st.sampled_from(["yes", "no", "true", "false"]))
        else:
            value = draw(st.sampled_from(["90s", "15m", "1h", "2h", "1d", "2d", "1w"]))
        alts.append((op, value))
    return Term(field, tuple(alts))


leaves = st.one_of(term(), term(), st.builds(Text, st.sampled_from([w for w in WORDS if w] + ["laude", "LAUDE"])))
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.builds(Not, children),
        st.builds(Paren, children),
        st.builds(Group, st.sampled_from(["and", "or"]), st.lists(children, min_size=2, max_size=4).map(tuple)),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows(), st.lists(trees, min_size=1, max_size=8))
def test_compiled_queries_select_what_the_python_filter_selects(table: list[Row], queries: list[Any]) -> None:
    with journal_of(table) as path, closing(sqlite3.connect(path)) as conn:
        for tree in queries:
            text = render(tree)
            expected = {row.values["id"] for row in table if evaluate(tree, row)}
            assert select_ids(conn, text) == expected, text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows(), st.lists(trees, min_size=1, max_size=8))
def test_indexed_queries_select_what_the_python_filter_selects(table: list[Row], queries: list[Any]) -> None:
    # Free text through the full-text index: words and phrases, bare words as prefixes.
    with journal_of(table) as path, closing(sqlite3.connect(path)) as conn:
        for tree in queries:
            text = render(tree)
            expected = {row.values["id"] for row in table if evaluate(tree, row, indexed=True)}
            assert select_ids(conn, text, indexed=True) == expected, text


text_leaves = st.builds(Text, st.sampled_from([w for w in WORDS if w] + ["laude", "LAUDE"]))
text_trees = st.recursive(
    text_leaves,
    lambda children: st.one_of(
        st.builds(Not, children),
        st.builds(Paren, children),
        st.builds(Group, st.sampled_from(["and", "or"]), st.lists(children, min_size=2, max_size=4).map(tuple)),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows(), st.lists(text_trees, min_size=1, max_size=8))
def test_free_text_counts_from_the_text_index_alone_are_exact(table: list[Row], queries: list[Any]) -> None:
    # A query of free text only is counted in the full-text index (one expression, or the
    # total less its matches); whatever the shape, the count is the selection's size.
    with journal_of(table) as path, JournalReader(path) as reader:
        for tree in queries:
            text = render(tree)
            expected = {row.values["id"] for row in table if evaluate(tree, row, indexed=True)}
            assert reader.count(text) == len(expected), text
            assert {r["id"] for r in reader.list_requests(len(table) + 1, query=text)} == expected, text


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([*'ab:"()|!*%_\\ <>=-', "model:", "status:", "has:", "4xx", "1s"]), max_size=20).map(
        "".join
    )
)
def test_any_text_compiles_to_sql_that_runs_or_is_refused_clearly(text: str) -> None:
    try:
        where, params = compile_query(text)
    except QueryError as exc:
        assert "column" in str(exc)
        return
    conn = sqlite3.connect(":memory:")
    try:
        schema.migrate(conn)
        conn.execute(f"SELECT id FROM requests WHERE {where}", params).fetchall()
    finally:
        conn.close()


# -- examples -----------------------------------------------------------------------------


def row(id: str, events: list[tuple[str, str]] | None = None, **values: Any) -> Row:
    base = {"id": id, "completed": 1, "has_tool_use": 0, "has_thinking": 0}
    return Row({**base, **values}, events or [])


def body(text: str) -> str:
    return orjson.dumps({"body": orjson.dumps({"messages": [{"content": text}]}).decode()}).decode()


EXAMPLES = [
    row(
        "req_ok",
        [("received", body("Tell me about the Rate Limit")), ("validated", '{"note":"secret word"}')],
        ts=NOW - 60,
        model="claude-sonnet",
        backend="http",
        status=200,
        stop_reason="max_tokens",
        ttfe_ms=2500.0,
        duration_ms=31_000.0,
        input_tokens=12_000,
        output_tokens=5,
        stream=1,
        tenant="team-a",
    ),
    row(
        "req_err",
        [("error", '{"message":"upstream overloaded"}')],
        ts=NOW - 7200,
        model="qwen",
        backend="grpc",
        status=529,
        error_code="overloaded_error",
        error_type="overloaded_error",
        stream=0,
        replay_of="req_ok",
        has_tool_use=1,
    ),
    row("req_inflight", ts=NOW - 1, model="claude-haiku", completed=0),
]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", {"req_ok", "req_err", "req_inflight"}),
        ("model:claude-*", {"req_ok", "req_inflight"}),
        ("model:CLAUDE-*", {"req_ok", "req_inflight"}),  # patterns ignore ASCII case
        ("model:Claude-sonnet", set()),  # exact values do not
        ("backend:grpc", {"req_err"}),
        ("status:>=500", {"req_err"}),
        ("status:5xx", {"req_err"}),
        ("status:!=5xx", {"req_ok"}),  # unknown status: false either way
        ("!status:5xx", {"req_ok", "req_inflight"}),
        ("code:overloaded_error", {"req_err"}),
        ("type:overloaded_*", {"req_err"}),
        ("stop:max_tokens", {"req_ok"}),
        ("has:tool_use", {"req_err"}),
        ("has:error", {"req_err"}),
        ("has:tool_use|thinking", {"req_err"}),
        ("ttft:>2s", {"req_ok"}),
        ("ttfe:>2500", set()),
        ("dur:>30s", {"req_ok"}),
        ("in:>10k out:<10", {"req_ok"}),
        ("tenant:team-a", {"req_ok"}),
        ("replay:yes", {"req_err"}),
        ("replay:no", {"req_ok", "req_inflight"}),
        ("stream:yes", {"req_ok"}),
        ("stream:no", {"req_err"}),
        ("id:req_e", {"req_err"}),
        ("id:*in*", {"req_inflight"}),
        ("since:15m", {"req_ok", "req_inflight"}),
        ("until:1h", {"req_err"}),
        ('"rate limit"', {"req_ok"}),
        ("overloaded", {"req_err"}),
        ("secret", set()),  # validated events are not searched
        ("model:qwen | stop:max_tokens", {"req_ok", "req_err"}),
        ("!(model:qwen | stop:max_tokens)", {"req_inflight"}),
        ("model:claude-* !status:200", {"req_inflight"}),
        ("(model:qwen | model:claude-sonnet) status:200", {"req_ok"}),
        ("model:qwen|claude-sonnet status:200", {"req_ok"}),
    ],
)
def test_examples(query: str, expected: set[str]) -> None:
    with journal_of(EXAMPLES) as path:
        assert select_ids(path, query) == expected
        if not query.startswith(("since", "until")):
            with JournalReader(path) as reader:
                assert reader.count(query) == len(expected)


def test_user_text_never_reaches_the_sql() -> None:
    hostile = "x') OR 1=1; DROP TABLE requests; --"
    for query in (f"model:{quote(hostile)}", quote(hostile), f"id:{quote(hostile)}", f"tenant:{quote(hostile)}*"):
        where, params = compile_query(query)
        assert "DROP" not in where and "1=1" not in where
        assert any("DROP" in str(p) for p in params)
    with journal_of(EXAMPLES) as path:
        assert select_ids(path, f"model:{quote(hostile)}") == set()
        assert select_ids(path, "") == {"req_ok", "req_err", "req_inflight"}


def test_like_metacharacters_are_literal() -> None:
    table = [row("a", model="a%c"), row("b", model="abc"), row("c", model="a_c")]
    with journal_of(table) as path:
        assert select_ids(path, "model:a%*") == {"a"}
        assert select_ids(path, "model:a_*") == {"c"}
        assert select_ids(path, "model:a*c") == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("model:claude (", "expected a term after '(' at column 15"),
        ("a)", "unmatched ')' at column 2"),
        ("a | | b", "expected a term after '|' at column 5"),
        ("model:x |", "expected a term after '|' at column 10"),
        ("!", "expected a term after '!'"),
        ("()", "expected a term after '(' at column 2"),
        ('"open', "unterminated quote at column 1"),
        ("colour:red", "unknown field 'colour'"),
        ("model:", "missing value after 'model:'"),
        ("status:high", "status: expected a number"),
        ("status:>4xx", "a status class compares only with = or !="),
        ("model:>x", "model: cannot compare with '>'"),
        ("dur:5d", "unit must be ms, s, m or h"),
        ("in:5s", "unexpected unit"),
        ("has:bugs", "has: takes tool_use, thinking, error"),
        ("stream:maybe", "stream: takes yes or no"),
        ("since:yesterday", "since: expected a duration ago"),
        ("since:>1h", "since: cannot compare with '>'"),
        ('""', "empty phrase"),
        ("(" * 200 + "a" + ")" * 200, "nested too deeply"),
    ],
)
def test_errors_name_the_position_and_token(query: str, message: str) -> None:
    with pytest.raises(QueryError, match=re.escape(message)) as info:
        compile_query(query)
    assert isinstance(info.value, ValueError)
    assert 0 <= info.value.position <= len(query)


def test_empty_query_is_true() -> None:
    assert compile_query("") == ("1", [])
    assert compile_query("   ") == ("1", [])
