"""The journal's query language, compiled to parameterised SQL over the `requests` table.

    model:claude-* status:>=500 | (code:overloaded_error !replay:yes) "rate limit"

`compile_query(text)` returns a boolean SQL expression over the columns of `requests` (usable
as `SELECT … FROM requests WHERE <expr>`) and its parameters. User text only ever reaches SQL
as a bound parameter; column names and operators come from the tables below.

Grammar (whitespace separates; `|` binds looser than whitespace, `!` tighter):

    query  := or?
    or     := and ('|' and)*
    and    := unary+                          whitespace means AND
    unary  := '!' unary | '(' or ')' | term | text
    term   := FIELD ':' [op] value ('|' [op] value)*     no spaces: `has:tool_use|thinking`
    op     := '=' | '!=' | '>=' | '<=' | '>' | '<'
    value  := bare | '"' quoted '"'           inside quotes, \\" and \\\\ are escapes
    text   := bare | '"' phrase '"'

Terms (a term whose column is unknown, e.g. the status of a request still in flight, is
false; `!` negates that):

* `model:` `backend:` `worker:` `tenant:` `path:` `code:` (error code) `type:` (error type)
  `stop:` (stop reason): exact and case-sensitive; a value with `*` is a pattern (`*` = any
  run of characters) matched case-insensitively (ASCII letters, as SQLite's LIKE). `=`, `!=`.
* `id:` a prefix of the request id, the gateway's or the client's (case-sensitive), or a `*`
  pattern (case-insensitive) matched against both. `=` only.
* `client_id:` the request id the client sent (`x-request-id` …; several requests may share
  one): exact and case-sensitive, or a `*` pattern, like the string fields. `=`, `!=`.
* `trace:` a W3C trace id (32 hex digits, any case): the request's trace, as its `received`
  event recorded it (the gateway's span's with `--enable-trace`, else the client's
  `traceparent`'s; the indexed `trace_id` column). `=` only.
* `status:` a number or a class (`4xx`, `5xx`); every op (classes: `=` and `!=`).
* `ttft:`, `ttfe:` (time to the first upstream/block event), `dur:` (duration): a number with
  a unit, `ms` (the default), `s`, `m` or `h`; every op.
* `in:`, `out:` token counts (`12k` = 12000); every op.
* `cost:` the request's cost in dollars (`cost:>0.05`, `cost:>=$1`; a request without a price
  has no cost and matches no `cost:` term); every op.
* `has:tool_use`, `has:thinking`, `has:error` (a status of 400 or more, or an error event).
* `stream:yes|no`, `replay:yes|no` (also `true`/`false`).
* `since:`, `until:` a duration ago (`90s`, `15m`, `2h`, `1d`, `1w`) or an ISO date/time
  (`2025-05-01`, `2025-05-01T12:00`, local time unless it has an offset); since is inclusive,
  until exclusive.

* `user:` (the
  body's `metadata.user_id`), `session:` (Claude Code's session header), `key:` (the 12-hex
  fingerprint of the caller's key, or the key itself: a reader that knows the journal's
  secret looks up its fingerprints, `journal.redact.key_fingerprints`), `thread:` (the
  conversation key `smg journal thread` follows): strings, like `model:`. `turns:` the
  number of messages sent; every op.
* `hung_up:yes|no` (the client went away before the end), `cut:yes|no` (a stream that had
  started and did not reach `message_stop`); also `has:hung_up`, `has:cut`.
* `replica:` the gateway replica that served the request (its `--replica-name`), a string like
  `model:`: the fleet journal in PostgreSQL (`journal.pgquery`) knows it for every request. A
  SQLite file is one gateway's own journal and names no replica, so there `replica:NAME`
  matches nothing and `!replica:NAME` everything (see `journal.store`).

Free text, on a journal with the full-text index (`indexed=True`: every journal this version
writes; see `journal.search` for what is indexed), matches words: a quoted phrase its words in
order, a bare word as a prefix (`overload` finds `overloaded`), case- and accent-insensitively.
On an older file, read as it is, free text matches, case-insensitively (ASCII letters), a
substring of the stored payload of one of the request's `received`, `upstream`, `block`,
`error` or `rejected` events: the request body, the response as relayed or built, error
messages. It is a literal (`*` included); a phrase must lie within one event (one streamed
delta, one network read), and it is matched against the payload as stored, JSON-escaped
once (`"` as `\\"`). A word that looks like a term with an unknown field (`foo:bar`) is an
error rather than text; quote it to search for it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from journal import search

__all__ = ["QueryError", "compile_query", "text_only", "FIELDS"]


class QueryError(ValueError):
    """The query cannot be compiled; the message names the position (1-based column) and token."""

    def __init__(self, message: str, position: int, token: str = "") -> None:
        where = f"at column {position + 1}" + (f" ({token!r})" if token else "")
        super().__init__(f"{message} {where}")
        self.position = position
        self.token = token


# field name -> (kind, column)
_STRING = "string"
_FIELDS: dict[str, tuple[str, str]] = {
    "model": (_STRING, "model"),
    "backend": (_STRING, "backend"),
    "worker": (_STRING, "worker"),
    "tenant": (_STRING, "tenant"),
    "path": (_STRING, "path"),
    "code": (_STRING, "error_code"),
    "type": (_STRING, "error_type"),
    "stop": (_STRING, "stop_reason"),
    "id": ("id", "id"),
    "client_id": (_STRING, "client_id"),
    "trace": ("trace", "trace_id"),
    "user": (_STRING, "user_id"),
    "session": (_STRING, "session_id"),
    "key": (_STRING, "key_fp"),
    "thread": (_STRING, "thread_key"),
    "turns": ("count", "turns"),
    "hung_up": ("flag", "hung_up"),
    "cut": ("flag", "cut_mid_stream"),
    "status": ("status", "status"),
    "ttft": ("duration", "ttfe_ms"),
    "ttfe": ("duration", "ttfe_ms"),
    "dur": ("duration", "duration_ms"),
    "in": ("count", "input_tokens"),
    "out": ("count", "output_tokens"),
    "cost": ("money", "cost_usd"),
    "has": ("has", ""),
    "stream": ("flag", "stream"),
    "replay": ("replay", "replay_of"),
    "since": ("since", "ts"),
    "until": ("until", "ts"),
    "replica": ("replica_name", "replica"),
}
FIELDS: tuple[str, ...] = tuple(_FIELDS)
"""The field names a term may use."""

# `run`: packed streaming events (journal.packed), whose text section spells their text as JSON.
_TEXT_KINDS = "('received', 'upstream', 'block', 'error', 'rejected', 'run')"
_OPS = ("!=", ">=", "<=", "=", ">", "<")  # longest first
_NUMERIC_OPS = frozenset(_OPS)
_EQ_OPS = frozenset({"=", "!="})
_HAS = {
    "tool_use": "has_tool_use = 1",
    "thinking": "has_thinking = 1",
    "error": "(IFNULL(status, 0) >= 400 OR error_type IS NOT NULL OR error_code IS NOT NULL)",
    "hung_up": "hung_up = 1",
    "cut": "cut_mid_stream = 1",
}
_YES = frozenset({"yes", "true"})
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_NO = frozenset({"no", "false"})
_DURATION_UNITS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
_AGO_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_NUMBER = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([a-zA-Z]*)")
_FIELD_NAME = re.compile(r"[A-Za-z_]+")
_STATUS_CLASS = re.compile(r"([1-9])xx", re.IGNORECASE)
_MAX_DEPTH = 100
_ID_END = "\U0010ffff"  # sorts after every character: [prefix, prefix + it) holds the prefix's ids

# -- tokens ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "(", ")", "|", "!", "word", "phrase", "term"
    start: int
    end: int
    text: str = ""  # word/phrase text; for a term, the value
    field: str = ""  # terms only
    op: str = ""  # terms only ("" = none given)
    quoted: bool = False  # terms: the value was quoted


def _read_quoted(text: str, start: int) -> tuple[str, int]:
    """The string opened by the quote at `start`, and the index after its closing quote."""
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in '"\\':
            out.append(text[i + 1])
            i += 2
        elif ch == '"':
            return "".join(out), i + 1
        else:
            out.append(ch)
            i += 1
    raise QueryError("unterminated quote", start, text[start : start + 20])


def _split_op(value: str) -> tuple[str, str]:
    for op in _OPS:
        if value.startswith(op):
            return op, value[len(op) :]
    return "", value


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "()|":
            tokens.append(_Token(ch, i, i + 1))
            i += 1
        elif ch == "!" and not text.startswith("!=", i):  # `!=` is an operator: `status:500|!=404`
            tokens.append(_Token("!", i, i + 1))
            i += 1
        elif ch == '"':
            phrase, end = _read_quoted(text, i)
            tokens.append(_Token("phrase", i, end, phrase))
            i = end
        else:
            start = i
            while i < n and not text[i].isspace() and text[i] not in '()|"':
                i += 1
            word = text[start:i]
            name, colon, rest = word.partition(":")
            if not colon or not _FIELD_NAME.fullmatch(name):
                tokens.append(_Token("word", start, i, word))
                continue
            field = name.lower()
            if field not in _FIELDS:
                raise QueryError(
                    f"unknown field {name!r} (fields: {', '.join(FIELDS)}; quote text that contains ':')",
                    start,
                    word,
                )
            op, value = _split_op(rest)
            quoted = False
            if not value and i < n and text[i] == '"':
                value, i = _read_quoted(text, i)
                quoted = True
            elif not value:
                raise QueryError(f"missing value after '{name}:{op}'", start, word)
            tokens.append(_Token("term", start, i, value, field, op, quoted))
    return tokens


# -- syntax tree ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Term:
    field: str
    op: str
    value: str
    quoted: bool
    pos: int
    token: str


@dataclass(frozen=True, slots=True)
class _Text:
    text: str
    pos: int
    quoted: bool = False


@dataclass(frozen=True, slots=True)
class _Not:
    item: _Node


@dataclass(frozen=True, slots=True)
class _Group:
    op: str  # "AND" | "OR"
    items: tuple[_Node, ...]


_Node = _Term | _Text | _Not | _Group


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def fail(self, message: str, token: _Token | None) -> QueryError:
        if token is None:
            return QueryError(message, len(self.text))
        return QueryError(message, token.start, self.text[token.start : token.end])

    def parse(self) -> _Node | None:
        if not self.tokens:
            return None
        node = self.parse_or()
        extra = self.peek()
        if extra is not None:
            raise self.fail("unmatched ')'" if extra.kind == ")" else "unexpected token", extra)
        return node

    def parse_or(self) -> _Node:
        items = [self.parse_and()]
        while (tok := self.peek()) is not None and tok.kind == "|":
            self.i += 1
            items.append(self.parse_and())
        return items[0] if len(items) == 1 else _Group("OR", tuple(items))

    def parse_and(self) -> _Node:
        items: list[_Node] = []
        while (tok := self.peek()) is not None and tok.kind not in (")", "|"):
            items.append(self.parse_unary())
        if not items:
            tok = self.peek()
            if tok is not None and tok.kind == ")" and self.depth == 0:
                raise self.fail("unmatched ')'", tok)
            prev = self.tokens[self.i - 1] if self.i else None
            after = f" after {prev.kind!r}" if prev is not None and prev.kind in "(|!" else ""
            raise self.fail(f"expected a term{after}", tok)
        return items[0] if len(items) == 1 else _Group("AND", tuple(items))

    def parse_unary(self) -> _Node:
        tok = self.peek()
        assert tok is not None
        if tok.kind == "!":
            self.i += 1
            following = self.peek()
            if following is None or following.kind in (")", "|"):
                raise self.fail("expected a term after '!'", following)
            return _Not(self.nested(self.parse_unary, tok))
        if tok.kind == "(":
            self.i += 1
            node = self.nested(self.parse_or, tok)
            close = self.peek()
            if close is None or close.kind != ")":
                raise self.fail("unclosed '('", tok)
            self.i += 1
            return node
        self.i += 1
        if tok.kind == "term":
            return self.term(tok)
        return _Text(tok.text, tok.start, tok.kind == "phrase")

    def nested(self, parse: Any, tok: _Token) -> _Node:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise self.fail("nested too deeply", tok)
        try:
            node: _Node = parse()
        finally:
            self.depth -= 1
        return node

    def term(self, tok: _Token) -> _Node:
        terms: list[_Node] = [_Term(tok.field, tok.op, tok.text, tok.quoted, tok.start, self.source(tok))]
        # `field:a|b` (no spaces) lists alternative values of one field.
        end = tok.end
        while self.i + 1 < len(self.tokens):
            bar, alt = self.tokens[self.i], self.tokens[self.i + 1]
            if not (bar.kind == "|" and bar.start == end and alt.kind in ("word", "phrase") and alt.start == bar.end):
                break
            self.i += 2
            end = alt.end
            if alt.kind == "phrase":
                terms.append(_Term(tok.field, "", alt.text, True, alt.start, self.source(alt)))
            else:
                op, value = _split_op(alt.text)
                if not value:
                    raise self.fail(f"missing value after '{op}'", alt)
                terms.append(_Term(tok.field, op, value, False, alt.start, self.source(alt)))
        return terms[0] if len(terms) == 1 else _Group("OR", tuple(terms))

    def source(self, tok: _Token) -> str:
        return self.text[tok.start : tok.end]


# -- SQL ------------------------------------------------------------------------------------


def like_escape(text: str) -> str:
    """`text` as a literal inside a LIKE pattern that uses `ESCAPE '\\'`."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _glob_to_like(value: str) -> str:
    return "%".join(like_escape(part) for part in value.split("*"))


_FINGERPRINT = re.compile(r"[0-9a-f]{12}")


class _Compiler:
    def __init__(self, now: float, indexed: bool, ordered: bool, fingerprints: Fingerprints | None = None) -> None:
        self.now = now
        self.indexed = indexed
        self.ordered = ordered
        self.fingerprints = fingerprints
        self.params: list[Any] = []

    def node(self, node: _Node) -> str:
        if isinstance(node, _Group):
            return "(" + f" {node.op} ".join(self.node(item) for item in node.items) + ")"
        if isinstance(node, _Not):
            return f"(NOT {self.node(node.item)})"
        if isinstance(node, _Text):
            return self.text(node)
        return self.term(node)

    def bind(self, value: Any) -> str:
        self.params.append(value)
        return "?"

    def text(self, node: _Text) -> str:
        if not node.text:
            raise QueryError("empty phrase", node.pos, '""')
        if self.indexed:
            match = search.match_expression(node.text, prefix=not node.quoted)
            if match is not None:
                table = search.TABLE
                # For a page (`ordered`), `+` keeps the planner from driving the query from the
                # matches (fetching and sorting every one of them for 50): it walks the time index
                # and looks each row up in them. A count is better driven from the matches.
                plus = "+" if self.ordered else ""
                return f"{plus}requests.rowid IN (SELECT rowid FROM {table} WHERE {table} MATCH {self.bind(match)})"
        # Payloads are stored as JSON: the needle is looked for as JSON spells it.
        needle = orjson.dumps(node.text).decode()[1:-1]
        pattern = self.bind(f"%{like_escape(needle)}%")
        return (
            "EXISTS (SELECT 1 FROM events AS ev WHERE ev.rk = requests.rk"
            f" AND ev.kind IN {_TEXT_KINDS} AND CAST(ev.data AS TEXT) LIKE {pattern} ESCAPE '\\')"
        )

    def term(self, term: _Term) -> str:
        kind, column = _FIELDS[term.field]
        op = term.op or "="
        allowed = (
            _NUMERIC_OPS
            if kind in ("status", "duration", "count", "money")
            else _EQ_OPS
            if kind in (_STRING, "replica_name")
            else {"="}
        )
        if op not in allowed:
            ops = " ".join(o for o in ("=", "!=", ">=", "<=", ">", "<") if o in allowed)
            raise QueryError(f"{term.field}: cannot compare with {op!r} (allowed: {ops})", term.pos, term.token)
        if kind == _STRING and term.field == "key" and self.fingerprints is not None:
            value = term.value
            if "*" not in value and not _FINGERPRINT.fullmatch(value):  # a key, not its fingerprint
                found = ", ".join(self.bind(fp) for fp in self.fingerprints(value))
                return f"({column} IS NOT NULL AND {column} {'IN' if op == '=' else 'NOT IN'} ({found}))"
        if kind == _STRING:
            return self.string(column, op, term.value)
        if kind == "replica_name":
            return self.replica(op, term.value)
        if kind == "id":
            return self.id_prefix(term.value)
        if kind == "trace":
            return self.trace(term)
        if kind in ("status", "duration", "count", "money"):
            return self.number(term, kind, column, op)
        if kind == "has":
            if term.value.lower() not in _HAS:
                raise QueryError(f"has: takes {', '.join(_HAS)}", term.pos, term.token)
            return _HAS[term.value.lower()]
        if kind in ("flag", "replay"):
            yes = self.yes_no(term)
            if kind == "replay":
                return f"{column} IS NOT NULL" if yes else f"{column} IS NULL"
            return f"({column} IS NOT NULL AND {column} = {1 if yes else 0})"
        ts = self.bind(self.moment(term))
        return f"({column} IS NOT NULL AND {column} {'>=' if kind == 'since' else '<'} {ts})"

    def replica(self, op: str, value: str) -> str:
        """A file names no replica: the term is false, whatever its value (`journal.store`)."""
        return "0"

    def string(self, column: str, op: str, value: str) -> str:
        if "*" in value:
            match = f"{column} LIKE {self.bind(_glob_to_like(value))} ESCAPE '\\'"
        elif column in search.KEYED:
            # Through its index by bucket (`journal.search.keyed`). A set of keys, never NULL, so
            # the term needs no `IS NOT NULL` to be two-valued: without it, a plan that walks
            # another index tests the term on that index's entries, never reading a row.
            keyed = search.keyed(f"{column} = {self.bind(value)}")
            return keyed if op == "=" else f"({column} IS NOT NULL AND NOT ({keyed}))"
        else:
            match = f"{column} = {self.bind(value)}"
        return f"({column} IS NOT NULL AND {match if op == '=' else f'NOT ({match})'})"

    def trace(self, term: _Term) -> str:
        value = term.value.strip().lower()
        if not _TRACE_ID.fullmatch(value):
            raise QueryError("trace: takes a trace id of 32 hex digits", term.pos, term.token)
        # The indexed summary column `journal.search` fills from the `received` event.
        return search.keyed(f"trace_id = {self.bind(value)}")

    def id_prefix(self, value: str) -> str:
        if "*" in value:
            like = _glob_to_like(value)
            in_id = f"id LIKE {self.bind(like)} ESCAPE '\\'"
            return f"({in_id} OR (client_id IS NOT NULL AND client_id LIKE {self.bind(like)} ESCAPE '\\'))"
        # `IS NOT NULL` keeps the term two-valued, so that `!id:` is its exact negation.
        in_id = f"id >= {self.bind(value)} AND id < {self.bind(value + _ID_END)}"
        low, high = self.bind(value), self.bind(value + _ID_END)
        in_client_id = search.keyed(f"client_id >= {low} AND client_id < {high}")
        return f"(({in_id}) OR {in_client_id})"

    def number(self, term: _Term, kind: str, column: str, op: str) -> str:
        value = term.value.strip()
        if kind == "status":
            klass = _STATUS_CLASS.fullmatch(value)
            if klass:
                if op not in _EQ_OPS:
                    raise QueryError("a status class compares only with = or !=", term.pos, term.token)
                low = int(klass.group(1)) * 100
                inside = f"{column} >= {self.bind(low)} AND {column} < {self.bind(low + 100)}"
                return f"({column} IS NOT NULL AND {'' if op == '=' else 'NOT '}({inside}))"
        match = _NUMBER.fullmatch(value.removeprefix("$") if kind == "money" else value)
        if not match:
            raise QueryError(f"{term.field}: expected a number", term.pos, term.token)
        number, unit = float(match.group(1)), match.group(2).lower()
        if kind == "duration":
            if unit and unit not in _DURATION_UNITS:
                raise QueryError(f"{term.field}: unit must be ms, s, m or h", term.pos, term.token)
            number *= _DURATION_UNITS[unit or "ms"]
        elif kind == "count" and unit == "k":
            number *= 1000
        elif unit:
            raise QueryError(f"{term.field}: unexpected unit {unit!r}", term.pos, term.token)
        if not math.isfinite(number):
            raise QueryError(f"{term.field}: number out of range", term.pos, term.token)
        bound: float | int = int(number) if kind != "duration" and number.is_integer() else number
        return f"({column} IS NOT NULL AND {column} {op} {self.bind(bound)})"

    def yes_no(self, term: _Term) -> bool:
        value = term.value.lower()
        if value in _YES:
            return True
        if value in _NO:
            return False
        raise QueryError(f"{term.field}: takes yes or no", term.pos, term.token)

    def moment(self, term: _Term) -> float:
        value = term.value.strip()
        match = _NUMBER.fullmatch(value)
        if match and match.group(2).lower() in _AGO_UNITS:
            return self.now - float(match.group(1)) * _AGO_UNITS[match.group(2).lower()]
        try:
            return datetime.fromisoformat(value).timestamp()  # naive: local time
        except (ValueError, OverflowError, OSError):
            raise QueryError(
                f"{term.field}: expected a duration ago (15m, 2h, 1d) or an ISO date", term.pos, term.token
            ) from None


Fingerprints = Callable[[str], list[str]]
"""A caller's key → the fingerprints it may be stored under (`journal.redact.key_fingerprints`)."""


def compile_query(
    text: str,
    *,
    now: float | None = None,
    indexed: bool = False,
    ordered: bool = False,
    fingerprints: Fingerprints | None = None,
) -> tuple[str, list[Any]]:
    """`text` as an SQL boolean expression over `requests` and its parameters; `""` is `("1", [])`.

    `now` (epoch seconds, default the current time) anchors `since:15m`-style terms.
    `indexed`: free text is looked up in the full-text index (`journal.search`; the file must
    have it) instead of scanned for in the events. Raises `QueryError` for a query that does
    not parse. `ordered`: the expression is for a page in time order (`ORDER BY ts … LIMIT n`),
    not for a count or an aggregate; it only changes the plan SQLite chooses. `fingerprints`:
    a `key:` value that is not a 12-hex fingerprint is a key, matched by these.
    """
    tree = parse(text)
    if tree is None:
        return "1", []
    compiler = _Compiler(time.time() if now is None else now, indexed, ordered, fingerprints)
    sql = compiler.node(tree)
    return sql, compiler.params


def parse(text: str) -> _Node | None:
    """The syntax tree of a query (None for an empty one), for a compiler to a store's SQL
    (`_Compiler` here for SQLite, `journal.pgquery` for PostgreSQL). Raises `QueryError`."""
    return _Parser(text).parse()


def text_only(text: str) -> tuple[str, bool] | None:
    """A query made only of free text (words and phrases under `!`, `|`, parentheses) as one
    full-text expression: `(expression, negated)`, the query's matches being the expression's
    (`negated`: every request but those). None for any other query.

    A count of such a query is a count in the full-text index alone, which holds a row only for
    requests that have a summary row: the same number the SQL of `compile_query` counts, without
    looking a single summary row up. Raises `QueryError` for a query that does not parse.
    """
    tree = _Parser(text).parse()
    if tree is None:
        return None
    return _fts(tree)


def _fts(node: _Node) -> tuple[str, bool] | None:
    if isinstance(node, _Text):
        match = search.match_expression(node.text, prefix=not node.quoted) if node.text else None
        return None if match is None else (match, False)
    if isinstance(node, _Not):
        inner = _fts(node.item)
        return None if inner is None else (inner[0], not inner[1])
    if isinstance(node, _Group):
        parts = [_fts(item) for item in node.items]
        if any(part is None for part in parts):
            return None
        positive = [f"({e})" for e, negated in filter(None, parts) if not negated]
        negative = [f"({e})" for e, negated in filter(None, parts) if negated]
        if node.op == "OR":
            if negative:  # `a | !b` is no one expression
                return None
            return " OR ".join(positive), False
        if not positive:  # !a !b: every request but those matching a or b
            return " OR ".join(negative), True
        expression = " AND ".join(positive)
        if negative:
            expression = f"({expression}) NOT ({' OR '.join(negative)})"
        return expression, False
    return None


# -- rollups --------------------------------------------------------------------------------

# The fields whose columns key a rollup row (`journal.rollups.DIMENSIONS`), and `has:` values
# over them alone.
_ROLLUP_FIELDS = frozenset({"model", "backend", "worker", "tenant", "code", "type", "stop", "key", "status"})
_ROLLUP_FLAGS = frozenset({"hung_up", "cut", "stream"})
_ROLLUP_HAS = frozenset({"error", "hung_up", "cut"})


@dataclass(frozen=True, slots=True)
class RollupPlan:
    """A query the rollups can answer: `where` (SQL over the rollup dimensions, which are named
    as in `requests`, so it also selects summary rows) with `params`, within the arrival range
    [`since`, `until`) (None: open)."""

    where: str
    params: list[Any]
    since: float | None
    until: float | None


def rollup_plan(
    text: str,
    *,
    now: float | None = None,
    compiler_type: type[_Compiler] | None = None,
    fingerprints: Fingerprints | None = None,
) -> RollupPlan | None:
    """`text` as a `RollupPlan`, or None when a part of it names something the rollups do not
    keep (free text, an id, a user, a duration, a token count, …) or a time range other than
    `since:`/`until:` terms of the top-level AND. `compiler_type`: the store's compiler (this
    module's for SQLite, `journal.pg.query`'s). `fingerprints`: as `compile_query`'s, for a
    `key:` that names a caller's key. Raises `QueryError` like `compile_query`."""
    tree = parse(text)
    compiler = (compiler_type or _Compiler)(time.time() if now is None else now, False, False, fingerprints)
    if tree is None:
        return RollupPlan("1 = 1", [], None, None)
    items = tree.items if isinstance(tree, _Group) and tree.op == "AND" else (tree,)
    since: float | None = None
    until: float | None = None
    rest: list[_Node] = []
    for item in items:
        if isinstance(item, _Term) and item.field in ("since", "until"):
            moment = compiler.moment(item)
            if item.field == "since":
                since = moment if since is None else max(since, moment)
            else:
                until = moment if until is None else min(until, moment)
        elif _in_rollups(item):
            rest.append(item)
        else:
            return None
    if not rest:
        return RollupPlan("1 = 1", [], since, until)
    where = compiler.node(rest[0] if len(rest) == 1 else _Group("AND", tuple(rest)))
    return RollupPlan(where, compiler.params, since, until)


def _in_rollups(node: _Node) -> bool:
    if isinstance(node, _Group):
        return all(_in_rollups(item) for item in node.items)
    if isinstance(node, _Not):
        return _in_rollups(node.item)
    if isinstance(node, _Text):
        return False
    if node.field == "has":
        return node.value.lower() in _ROLLUP_HAS
    return node.field in _ROLLUP_FIELDS or node.field in _ROLLUP_FLAGS
