"""Incremental JSON for the tool parsers: a character-at-a-time validator, a streamer that lets
an arguments object out as soon as its prefix can still only end as valid JSON, and a reader
for the `{"name": …, "arguments": {…}}` call objects of the JSON-based formats.

Everything here is decided character by character from the text alone, so the result never
depends on how the text was cut into deltas.

Strings are read leniently: a raw control character (a newline in generated code, say) is
passed on escaped, and an invalid escape (`\\U` in a Windows path) keeps its backslash as a
literal one. The text these classes hand on is therefore always strict JSON, which is what the
`input_json_delta` fragments must add up to.
"""

from __future__ import annotations

import json
import re
from typing import Any

# What `push` says about the character it was given.
MORE = 0  # consumed; the value goes on
DONE = 1  # consumed; it completed the value
END = 2  # not consumed: the value (a bare number) had already ended before it
ERROR = 3  # not consumed: it cannot continue the value

WHITESPACE = " \t\n\r"
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_SIMPLE_ESCAPES = '"\\/bfnrt'

# Expectations outside strings, numbers and literals.
_VALUE = 0  # a value must come (start, after `:`, after `,` in an array)
_FIRST_KEY = 1  # just after `{`: a key or `}`
_KEY = 2  # after `,` in an object: a key
_COLON = 3
_NEXT = 4  # after a value in a container: `,` or the closer
_FIRST_ITEM = 5  # just after `[`: a value or `]`
_STRING = 6
_NUMBER = 7
_LITERAL = 8
_DONE = 9

# Number states; the ones a number may end in are _ENDABLE.
_N_SIGN, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_ENDABLE = frozenset({_N_ZERO, _N_INT, _N_FRAC, _N_EXP})


# A run of string characters that need no attention, taken in one step.
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')


def _escape_control(ch: str) -> str:
    return json.dumps(ch)[1:-1]


class JsonScanner:
    """One JSON value, validated as it arrives; `text()` is the value as strict JSON."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._stack: list[str] = []
        self._closers = ""
        self._state = _VALUE
        self._after_string = _NEXT
        self._is_key = False
        self._escape = False
        self._hex_left = 0
        self._num = _N_INT
        self._literal = ""

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def text(self) -> str:
        return "".join(self.parts)

    def closure(self) -> str | None:
        """What would close the value right here, or None if the text so far cannot be closed
        by appending alone (inside a key, a literal, an escape, or just after `,` or `:`)."""
        state = self._state
        if state == _STRING:
            if self._is_key or self._escape or self._hex_left:
                return None
            return '"' + self._closers
        if state == _NUMBER:
            return self._closers if self._num in _ENDABLE else None
        if state in (_FIRST_KEY, _FIRST_ITEM, _NEXT):
            return self._closers
        if state == _DONE:
            return ""
        return None

    def push(self, ch: str) -> int:
        state = self._state
        if state == _STRING:
            return self._string(ch)
        if state == _NUMBER:
            status = self._number(ch)
            if status != END or not self._stack:
                return status
            state = self._state  # the number ended inside a container: `ch` comes after it
        elif state == _LITERAL:
            if ch != self._literal[0]:
                return ERROR
            self.parts.append(ch)
            self._literal = self._literal[1:]
            return self._value_done() if not self._literal else MORE
        if state == _DONE:
            return END
        if ch in WHITESPACE:
            if not self._stack and state == _VALUE:
                return ERROR  # a scanner starts at its value's first character
            self.parts.append(ch)
            return MORE
        if state == _VALUE or state == _FIRST_ITEM:
            if state == _FIRST_ITEM and ch == "]":
                return self._close(ch)
            return self._start_value(ch)
        if state == _FIRST_KEY or state == _KEY:
            if state == _FIRST_KEY and ch == "}":
                return self._close(ch)
            if ch != '"':
                return ERROR
            self.parts.append(ch)
            self._state, self._is_key = _STRING, True
            return MORE
        if state == _COLON:
            if ch != ":":
                return ERROR
            self.parts.append(ch)
            self._state = _VALUE
            return MORE
        # _NEXT
        if ch == ",":
            self.parts.append(ch)
            self._state = _KEY if self._stack[-1] == "{" else _VALUE
            return MORE
        if ch == self._closers[0]:
            return self._close(ch)
        return ERROR

    def _start_value(self, ch: str) -> int:
        if ch == "{" or ch == "[":
            self._stack.append(ch)
            self._closers = ("}" if ch == "{" else "]") + self._closers
            self._state = _FIRST_KEY if ch == "{" else _FIRST_ITEM
        elif ch == '"':
            self._state, self._is_key = _STRING, False
        elif ch == "-" or ch in _DIGITS:
            self._state = _NUMBER
            self._num = _N_SIGN if ch == "-" else _N_ZERO if ch == "0" else _N_INT
        elif ch in "tfn":
            self._state = _LITERAL
            self._literal = {"t": "rue", "f": "alse", "n": "ull"}[ch]
        else:
            return ERROR
        self.parts.append(ch)
        return MORE

    def _close(self, ch: str) -> int:
        self.parts.append(ch)
        self._stack.pop()
        self._closers = self._closers[1:]
        return self._value_done()

    def _value_done(self) -> int:
        if not self._stack:
            self._state = _DONE
            return DONE
        self._state = _NEXT
        return MORE

    def _string(self, ch: str) -> int:
        if self._hex_left:
            if ch not in _HEX:
                return ERROR
            self.parts.append(ch)
            self._hex_left -= 1
            return MORE
        if self._escape:
            self._escape = False
            if ch in _SIMPLE_ESCAPES:
                self.parts.append("\\" + ch)
            elif ch == "u":
                self.parts.append("\\u")
                self._hex_left = 4
            else:
                # Not a JSON escape: the model meant a literal backslash.
                self.parts.append("\\\\" + (_escape_control(ch) if ch < " " else ch))
            return MORE
        if ch == "\\":
            self._escape = True
            return MORE
        if ch == '"':
            self.parts.append(ch)
            if self._is_key:
                self._state = _COLON
                return MORE
            return self._value_done()
        self.parts.append(_escape_control(ch) if ch < " " else ch)
        return MORE

    def _number(self, ch: str) -> int:
        num = self._num
        digit = ch in _DIGITS
        if num == _N_SIGN:
            nxt = _N_ZERO if ch == "0" else _N_INT if digit else -1
        elif num in (_N_ZERO, _N_INT, _N_FRAC):
            if digit and num != _N_ZERO:
                nxt = num
            elif ch == "." and num != _N_FRAC:
                nxt = _N_DOT
            elif ch in "eE":
                nxt = _N_E
            else:
                nxt = -2
        elif num == _N_DOT:
            nxt = _N_FRAC if digit else -1
        elif num == _N_E:
            nxt = _N_ESIGN if ch in "+-" else _N_EXP if digit else -1
        elif num == _N_ESIGN:
            nxt = _N_EXP if digit else -1
        else:  # _N_EXP
            nxt = _N_EXP if digit else -2
        if nxt == -1:
            return ERROR
        if nxt == -2:
            # `ch` does not continue the number, which is complete: it belongs after it.
            self._value_done()
            return END
        self._num = nxt
        self.parts.append(ch)
        return MORE


class ArgsStream:
    """An arguments object, let out as it arrives: `take()` returns the text that became safe —
    text that valid JSON can still follow by appending alone — and `repair()` what is left plus
    that closing, for a call cut short. Keys, partial literals and pending commas are held until
    the next value starts."""

    def __init__(self) -> None:
        self.scanner = JsonScanner()
        self._sent = 0
        self._safe = 0
        self._safe_closure = ""

    @property
    def done(self) -> bool:
        return self.scanner.done

    def push(self, ch: str) -> int:
        status = self.scanner.push(ch)
        if status == MORE or status == DONE:
            closure = self.scanner.closure()
            if closure is not None:
                self._safe = len(self.scanner.parts)
                self._safe_closure = closure
        return status

    def feed(self, text: str, i: int = 0) -> tuple[int, int]:
        """Push `text[i:]` until the object completes or breaks: (status, where it stopped)."""
        scanner = self.scanner
        n = len(text)
        while i < n:
            if scanner._state == _STRING and not scanner._escape and not scanner._hex_left:
                plain = _PLAIN.match(text, i)
                if plain is not None:
                    scanner.parts.append(plain.group())
                    i = plain.end()
                    if not scanner._is_key:
                        self._safe = len(scanner.parts)
                        self._safe_closure = '"' + scanner._closers
                    continue
            status = self.push(text[i])
            if status == ERROR or status == END:
                return status, i
            i += 1
            if status == DONE:
                return DONE, i
        return MORE, i

    def take(self) -> str:
        if self._safe == self._sent:
            return ""
        fragment = "".join(self.scanner.parts[self._sent : self._safe])
        self._sent = self._safe
        return fragment

    def repair(self) -> str:
        """The rest of a cut-short object: the safe text not yet taken and its closing."""
        rest = self.take() + self._safe_closure
        self._safe_closure = ""
        return rest

    def pending(self) -> str:
        """The text read past the last safe point (a key, a comma…), which `repair` leaves out."""
        return "".join(self.scanner.parts[self._safe :])


# JsonCall states.
_W_START, _W_KEY_OR_END, _W_KEY, _W_IN_KEY, _W_COLON, _W_VALUE, _W_IN_VALUE, _W_IN_ARGS, _W_NEXT, _W_DONE = range(10)


class JsonCall:
    """One `{"name": f, "arguments": {…}}` object (any key order, other keys ignored).

    `name` is set once the name string is complete; `args_started` once the arguments value has
    begun. An object argument streams through `take()`; any other arguments value is read whole
    and, at the end, `final_args()` makes what it can of it (a string holding a JSON object is
    decoded, the rest gives no arguments)."""

    def __init__(
        self, name_keys: tuple[str, ...] = ("name",), args_keys: tuple[str, ...] = ("arguments", "parameters")
    ):
        self.name_keys = name_keys
        self.args_keys = args_keys
        self.name: str | None = None
        self.args_started = False
        self.args: ArgsStream | None = None
        self._state = _W_START
        self._scan: JsonScanner | None = None
        self._key = ""
        self._other_args: str | None = None

    @property
    def done(self) -> bool:
        return self._state == _W_DONE

    def take(self) -> str:
        return self.args.take() if self.args is not None else ""

    def final_args(self) -> str:
        """The arguments not yet taken of a complete object ("" when it has none to give)."""
        if self.args is not None:
            return self.args.take()
        if self._other_args is not None:
            return _decoded_object(self._other_args)
        return ""

    def repair(self) -> str:
        return self.args.repair() if self.args is not None else ""

    def pending(self) -> str:
        return self.args.pending() if self.args is not None and not self.args.done else ""

    def feed(self, text: str, i: int = 0) -> tuple[int, int]:
        """Push `text[i:]` until the object completes or breaks: (status, where it stopped)."""
        n = len(text)
        while i < n:
            if self._state == _W_IN_ARGS:
                assert self.args is not None
                status, i = self.args.feed(text, i)
                if status == ERROR:
                    return ERROR, i
                if status == DONE:
                    self._state = _W_NEXT
                continue
            status = self.push(text[i])
            if status == ERROR:
                return ERROR, i
            i += 1
            if status == DONE:
                return DONE, i
        return MORE, i

    def push(self, ch: str) -> int:
        state = self._state
        if state == _W_IN_ARGS:
            assert self.args is not None
            status = self.args.push(ch)
            if status == ERROR:
                return ERROR
            if status == DONE:
                self._state = _W_NEXT
            return MORE
        if state == _W_IN_VALUE or state == _W_IN_KEY:
            assert self._scan is not None
            status = self._scan.push(ch)
            if status == ERROR:
                return ERROR
            if status == MORE:
                return MORE
            if state == _W_IN_KEY:
                self._key = json.loads(self._scan.text())
                self._state = _W_COLON
                return MORE
            self._value_done(self._scan.text())
            self._state = _W_NEXT
            return MORE if status == DONE else self.push(ch)
        if state == _W_START:
            if ch != "{":
                return ERROR
            self._state = _W_KEY_OR_END
            return MORE
        if ch in WHITESPACE:
            return MORE if state != _W_DONE else ERROR
        if state == _W_KEY_OR_END or state == _W_KEY:
            if ch == "}" and state == _W_KEY_OR_END:
                self._state = _W_DONE
                return DONE
            if ch != '"':
                return ERROR
            self._scan = JsonScanner()
            self._scan.push(ch)
            self._state = _W_IN_KEY
            return MORE
        if state == _W_COLON:
            if ch != ":":
                return ERROR
            self._state = _W_VALUE
            return MORE
        if state == _W_VALUE:
            is_args = self._key in self.args_keys and not self.args_started
            if is_args:
                self.args_started = True
                if ch == "{":
                    self.args = ArgsStream()
                    self.args.push(ch)
                    self._state = _W_IN_ARGS
                    return MORE
            self._scan = JsonScanner()
            if self._scan.push(ch) == ERROR:
                return ERROR
            if is_args:
                self._other_args = ""
            self._state = _W_IN_VALUE
            return MORE
        if state == _W_NEXT:
            if ch == ",":
                self._state = _W_KEY
                return MORE
            if ch == "}":
                self._state = _W_DONE
                return DONE
        return ERROR

    def _value_done(self, text: str) -> None:
        if self._other_args == "":
            self._other_args = text
        elif self._key in self.name_keys and self.name is None and text.startswith('"'):
            self.name = json.loads(text) or None


def _decoded_object(text: str) -> str:
    """Arguments given as a JSON string holding an object (double-encoded) → that object."""
    if not text.startswith('"'):
        return ""
    try:
        value: Any = json.loads(json.loads(text))
        return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else ""
    except (ValueError, RecursionError):
        return ""
