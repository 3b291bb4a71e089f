"""Python literals read as JSON, a character at a time, for the formats whose call objects are
written as Python `repr`s (`sarashina`: `{'name': 'f', 'arguments': {'a': True}}`).

`PyLiteralJson.push(ch)` turns each character into the JSON text it stands for: single-quoted
strings become double-quoted ones with their escapes rewritten, `True`/`False`/`None` become
`true`/`false`/`null`, tuples become arrays and trailing commas go, so the JSON readers of
jsonstream.py validate and stream it unchanged. JSON's own spellings pass through. An escape
Python would refuse (`'C:\\Users'`) keeps its backslash as a literal one, as jsonstream.py reads
JSON. A bare name other than those literals (or a `b''` string) makes `push` answer None; other
non-JSON (a set) is let through, to fail in the JSON reader.
"""

from __future__ import annotations

import json

from smg.pipeline.parsers.tools import jsonstream as js

_WORDS = {"True": "true", "False": "false", "None": "null", "true": "true", "false": "false", "null": "null"}
_SIMPLE = {"n": "\\n", "t": "\\t", "r": "\\r", "b": "\\b", "f": "\\f", "a": "\\u0007", "v": "\\u000b", "\\": "\\\\"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_HEX = frozenset("0123456789abcdefABCDEF")
_OCTAL = frozenset("01234567")
_NUMBER = frozenset("0123456789.eE+-")


def _code_point(value: int) -> str:
    """A code point as JSON string content (a surrogate pair above the BMP)."""
    return json.dumps(chr(value))[1:-1] if value < 0x110000 else ""


class PyLiteralJson:
    def __init__(self) -> None:
        self._quote = ""  # inside a string: its quote
        self._escape: str | None = None  # after a backslash: the escape read so far
        self._word = ""  # a bare word (True, None…) being read
        self._number = False  # inside a number (whose `e` is not a word)
        self._comma = ""  # a comma, and the whitespace after it, until the next token shows it is not trailing

    def push(self, ch: str) -> str | None:
        if self._quote:
            return self._in_string(ch)
        out = ""
        if self._word:
            if ch.isalnum() or ch == "_":
                self._word += ch
                return ""
            word = _WORDS.get(self._word)
            if word is None:
                return None
            out, self._word = word, ""
        if self._comma:
            if ch in js.WHITESPACE:
                self._comma += ch
                return out
            if ch in "}])":
                out += self._comma[1:]  # a trailing comma: only its whitespace stays
            else:
                out += self._comma
            self._comma = ""
        if self._number:
            if ch in _NUMBER:
                return out + ch
            self._number = False
        if ch == "'" or ch == '"':
            self._quote = ch
            return out + '"'
        if ch == ",":
            self._comma = ","
            return out
        if ch == "(":
            return out + "["
        if ch == ")":
            return out + "]"
        if ch.isalpha() or ch == "_":
            self._word = ch
            return out
        if ch.isdigit() or ch == "-":
            self._number = True
        return out + ch

    def _in_string(self, ch: str) -> str | None:
        escape = self._escape
        if escape is None:
            if ch == self._quote:
                self._quote = ""
                return '"'
            if ch == "\\":
                self._escape = ""
                return ""
            return '\\"' if ch == '"' else ch
        if not escape:
            return self._escape_start(ch)
        kind = escape[0]
        if kind in _OCTAL:
            if ch in _OCTAL and len(escape) < 3:
                self._escape = escape + ch
                return ""
            self._escape = None
            rest = self._in_string(ch)
            return None if rest is None else _code_point(int(escape, 8)) + rest
        if ch not in _HEX:
            # A cut-short `\x`/`\u`/`\U` (`C:\Users`): the backslash is meant literally.
            self._escape = None
            rest = self._in_string(ch)
            return None if rest is None else "\\\\" + escape + rest
        escape += ch
        if len(escape) - 1 < _HEX_DIGITS[kind]:
            self._escape = escape
            return ""
        self._escape = None
        text = _code_point(int(escape[1:], 16))
        return text or None

    def _escape_start(self, ch: str) -> str:
        """The character after a backslash."""
        self._escape = None
        if ch == "'":
            return "'"
        if ch == '"':
            return '\\"'
        if ch == "\n":
            return ""  # a line continuation
        if ch in _SIMPLE:
            return _SIMPLE[ch]
        if ch in _HEX_DIGITS or ch in _OCTAL:
            self._escape = ch
            return ""
        return "\\\\" + ch  # not an escape in Python either: the backslash is literal


class PyLiteralCall(js.JsonCall):
    """A `JsonCall` over a call object written as a Python literal."""

    def __init__(self, name_keys: tuple[str, ...] = ("name",), args_keys: tuple[str, ...] = ("arguments",)):
        super().__init__(name_keys, args_keys)
        self._py = PyLiteralJson()

    def feed(self, text: str, i: int = 0) -> tuple[int, int]:
        n = len(text)
        while i < n:
            out = self._py.push(text[i])
            if out is None:
                return js.ERROR, i
            for ch in out:
                status = self.push(ch)
                if status == js.ERROR:
                    return js.ERROR, i
                if status == js.DONE:
                    return js.DONE, i + 1
            i += 1
        return js.MORE, i
