"""The pythonic tool-call format (behaviors.md §F.8 `pythonic`; Llama 4, generic DeepSeek):

    [get_weather(city="Paris", days=3), get_time(zone='CET')]

a Python list of calls with keyword arguments whose values are Python literals (Llama 4 may
wrap it in `<|python_start|>` … `<|python_end|>`). A list counts once it opens with
`[name(`; each call goes out when its parentheses close, its arguments converted to JSON
(tuples become arrays). A call that is not a plain literal call — positional arguments,
expressions — ends the list there and the rest is text.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from smg.pipeline.parsers.tools.base import TEXT, ToolParser

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"

_CALL_START = re.compile(r"\s*[A-Za-z_][\w.]*\s*\(")
# What can still grow into the start of a call: whitespace, then a name, then `(`.
_CALL_START_PREFIX = re.compile(r"\s*(?:[A-Za-z_][\w.]*\s*)?")
_OPEN = "([{"
_CLOSE = {")": "(", "]": "[", "}": "{"}


class PythonicParser(ToolParser):
    name = "pythonic"
    start_markers = ("[", PYTHON_START)
    # The call being read: where its parentheses close, and its text so far.
    _scan: _Balance
    _source: list[str]

    def _open(self, marker: str) -> None:
        self.mode = "list" if marker == "[" else "tag"

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "tag":
            if not self._skip_ws():
                return False
            if self._buf[0] != "[":
                self._fail()
                return True
            self._consume(1)
            self.mode = "list"
            return True
        if mode == "list":
            match = _CALL_START.match(self._buf)
            if not match:
                prefix = _CALL_START_PREFIX.match(self._buf)
                if prefix is not None and prefix.end() == len(self._buf) and len(self._buf) < 256:
                    return False
                self._fail()
                return True
            self._scan = _Balance()
            self._source = []
            self.mode = "call"
            return True
        if mode == "call":
            return self._step_call()
        # "next": after a call
        if not self._skip_ws():
            return False
        ch = self._buf[0]
        if ch == ",":
            self._consume(1)
            self.mode = "list"
        elif ch == "]":
            self._consume(1)
            self._raw = []
            self._pending_end = PYTHON_END
            self.mode = TEXT
        else:
            self._fail()
        return True

    def _step_call(self) -> bool:
        end = self._scan.feed(self._buf)
        if end is None:
            self._source.append(self._consume(len(self._buf)))
            return False
        if end < 0:
            self._fail()
            return True
        parsed = _parse_call("".join(self._source) + self._buf[:end])
        if parsed is None:
            self._fail()
            return True
        self._consume(end)
        name, args = parsed
        self._open_call(name)
        self._args(args)
        self._close_call()
        self.mode = "next"
        return True


class _Balance:
    """Finds where a call's parentheses close, skipping over strings."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.quote = ""
        self.escape = False

    def feed(self, text: str) -> int | None:
        """Index in `text` just past the `)` that closes the call, None if it is not there yet,
        -1 if the brackets do not match."""
        for i in range(len(text)):
            ch = text[i]
            if self.quote:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == self.quote:
                    self.quote = ""
            elif ch in "'\"":
                self.quote = ch
            elif ch in _OPEN:
                self.stack.append(ch)
            elif ch in _CLOSE:
                if not self.stack or self.stack.pop() != _CLOSE[ch]:
                    return -1
                if not self.stack:
                    return i + 1
        return None


def _parse_call(source: str) -> tuple[str, str] | None:
    """(name, arguments as JSON) of a literal keyword call, else None."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
        call = tree.body
        if not isinstance(call, ast.Call) or call.args:
            return None
        name = _dotted(call.func)
        if name is None or any(keyword.arg is None for keyword in call.keywords):
            return None
        args = {keyword.arg: _jsonable(ast.literal_eval(keyword.value)) for keyword in call.keywords}
        return name, json.dumps(args, ensure_ascii=False, allow_nan=False)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else base + "." + node.attr
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float)):
        return value  # bool is an int; NaN and infinities are refused by json.dumps
    raise ValueError("not JSON")
