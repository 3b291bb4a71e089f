"""The journal's query language compiled to PostgreSQL, over the fleet journal's `requests`.

The same syntax tree as `journal.query` (one parser, one grammar, the same errors), compiled
for the tables of `journal.pg`: `%s` placeholders (user text only ever reaches SQL as a bound
parameter), and the same meaning term by term:

* string fields (`model:`, `replica:` …): exact and case-sensitive, or a `*` pattern matched
  case-insensitively on ASCII letters only, as SQLite's LIKE matches (both sides folded with
  `translate`, not `ILIKE`, which folds every letter);
* `id:` a prefix (`LIKE 'p%'`, read from the `text_pattern_ops` indexes) of the gateway's or
  the client's id;
* free text: `request_text.tsv @@ smg_text_query(text, prefix)` (`journal.pg`): the words of
  the text as a phrase, a bare word a prefix, split, lower-cased and unaccented as the local
  FTS5 index does. Text without a word (`"%%"`) has nothing to look up in the index and is
  looked for in the stored events, as on a local file without the index: a substring of the
  JSON payload of a `received`, `upstream`, `block`, `error`, `rejected` event or a packed run
  (compared in PostgreSQL's `escape` encoding of the bytes, ASCII letters folded);
* `replica:` the replica that served the request (`requests.replica`, never NULL here).

Every term is two-valued (never NULL), so `!` is the exact complement, as in SQLite.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from journal.query import (
    Fingerprints,
    _Compiler,
    _glob_to_like,
    _Group,
    _Node,
    _Not,
    _Term,
    _Text,
    like_escape,
    parse,
)

_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_FOLD = str.maketrans(_UPPER, _LOWER)
_TEXT_KINDS = "('received', 'upstream', 'block', 'error', 'rejected', 'run')"
_FAILED = "(COALESCE(status, 0) >= 400 OR error_type IS NOT NULL OR error_code IS NOT NULL)"
"""A failed request (the query's `has:error`, the statistics' errors), in PostgreSQL."""


def folded(sql: str) -> str:
    """SQL folding ASCII capitals of the text `sql` to small letters (SQLite's LIKE case rule)."""
    return f"translate({sql}, '{_UPPER}', '{_LOWER}')"


def _escape_bytes(text: str) -> str:
    """`text`'s UTF-8 bytes as PostgreSQL's `encode(…, 'escape')` spells them: backslashes
    doubled, NUL and bytes with the high bit set as `\\ooo`."""
    out = []
    for byte in text.encode("utf-8", "surrogatepass"):
        if byte == 0x5C:
            out.append("\\\\")
        elif byte == 0 or byte >= 0x80:
            out.append(f"\\{byte:03o}")
        else:
            out.append(chr(byte))
    return "".join(out)


class _PgCompiler(_Compiler):
    def bind(self, value: Any) -> str:
        self.params.append(value)
        return "%s"

    def term(self, term: _Term) -> str:
        if term.field == "has" and term.value.lower() == "error" and (term.op or "=") == "=":
            return _FAILED
        return super().term(term)

    def replica(self, op: str, value: str) -> str:
        return self.string("replica", op, value)

    def string(self, column: str, op: str, value: str) -> str:
        if "*" in value:
            pattern = self.bind(_glob_to_like(value).translate(_FOLD))
            match = f"{folded(column)} LIKE {pattern} ESCAPE '\\'"
        else:
            match = f"{column} = {self.bind(value)}"
        return f"({column} IS NOT NULL AND {match if op == '=' else f'NOT ({match})'})"

    def trace(self, term: _Term) -> str:
        super().trace(term)  # validates the id and binds it lower-cased: taken back to bind here
        value = self.params.pop()
        return f"(trace_id IS NOT NULL AND trace_id = {self.bind(value)})"

    def id_prefix(self, value: str) -> str:
        if "*" in value:
            like = _glob_to_like(value).translate(_FOLD)
            in_id = f"{folded('id')} LIKE {self.bind(like)} ESCAPE '\\'"
            in_client = f"{folded('client_id')} LIKE {self.bind(like)} ESCAPE '\\'"
            return f"({in_id} OR (client_id IS NOT NULL AND {in_client}))"
        prefix = like_escape(value) + "%"
        return (
            f"(id LIKE {self.bind(prefix)} ESCAPE '\\'"
            f" OR (client_id IS NOT NULL AND client_id LIKE {self.bind(prefix)} ESCAPE '\\'))"
        )

    def text(self, node: _Text) -> str:
        if not node.text:
            return super().text(node)  # the error: an empty phrase
        if any(c.isalnum() for c in node.text):
            query = f"smg_text_query({self.bind(node.text)}, {self.bind(not node.quoted)})"
            return (
                "EXISTS (SELECT 1 FROM request_text AS x WHERE x.rk = requests.rk AND x.day = requests.day"
                f" AND x.tsv @@ {query})"
            )
        # Payloads are stored as JSON: the needle is looked for as JSON spells it.
        data = folded("encode(ev.data, 'escape')")
        needle = _escape_bytes(orjson.dumps(node.text).decode("utf-8")[1:-1]).translate(_FOLD)
        pattern = self.bind(f"%{like_escape(needle)}%")
        return (
            "EXISTS (SELECT 1 FROM events AS ev WHERE ev.rk = requests.rk AND ev.day = requests.day"
            f" AND ev.kind IN {_TEXT_KINDS} AND {data} LIKE {pattern} ESCAPE '\\')"
        )


def compile_query(
    text: str, *, now: float | None = None, fingerprints: Fingerprints | None = None
) -> tuple[str, list[Any]]:
    """`text` as a PostgreSQL boolean expression over the fleet journal's `requests` and its
    parameters (`%s`); `""` is `("TRUE", [])`. `now` anchors `since:15m`-style terms;
    `fingerprints` match a `key:` that names a caller's key (`journal.query.compile_query`).
    Raises `journal.query.QueryError` for a query that does not parse."""
    tree = parse(text)
    if tree is None:
        return "TRUE", []
    compiler = _PgCompiler(time.time() if now is None else now, indexed=True, ordered=False, fingerprints=fingerprints)
    return compiler.node(tree), compiler.params


def text_only(text: str) -> tuple[str, list[Any], bool] | None:
    """A query made only of free text with a word in each (words and phrases under `!`, `|`,
    parentheses) as one condition over `request_text` alone: `(sql, params, negated)`, the
    query's matches being the text rows the condition holds for (`negated`: every request but
    those). None for any other query. As on a file (`journal.query.text_only`): a count of such a
    query is a count in the text index alone, which holds a row only for shipped requests, never
    joined to their summary rows. Raises `QueryError` for a query that does not parse."""
    tree = parse(text)
    if tree is None:
        return None
    params: list[Any] = []
    found = _text_condition(tree, params)
    return None if found is None else (found[0], params, found[1])


def _text_condition(node: _Node, params: list[Any]) -> tuple[str, bool] | None:
    if isinstance(node, _Text):
        if not node.text or not any(c.isalnum() for c in node.text):
            return None
        params.extend((node.text, not node.quoted))
        return "tsv @@ smg_text_query(%s, %s)", False
    if isinstance(node, _Not):
        inner = _text_condition(node.item, params)
        return None if inner is None else (inner[0], not inner[1])
    if isinstance(node, _Group):
        parts = [_text_condition(item, params) for item in node.items]
        if any(part is None for part in parts):
            return None
        sqls = [(f"({sql})" if not negated else f"(NOT ({sql}))", negated) for sql, negated in filter(None, parts)]
        if node.op == "OR":
            if any(negated for _, negated in sqls):  # `a | !b` holds for requests without text too
                return None
            return " OR ".join(sql for sql, _ in sqls), False
        if all(negated for _, negated in sqls):  # !a !b: every request but those matching a or b
            return " OR ".join(sql[5:-1] for sql, _ in sqls), True
        if not any(not negated for _, negated in sqls):
            return None
        return " AND ".join(sql for sql, _ in sqls), False
    return None
