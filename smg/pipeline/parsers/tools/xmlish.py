"""The machinery of the formats whose arguments are XML-style parameters (`qwen_xml`, the GLM
formats, `minimax_m2`): each parameter becomes one member of the arguments object.

The object is written member by member as parameters complete — `{"a": 1`, then `, "b": 2`,
then `}` when the call closes — so the fragments always add up to one JSON object (a repeated
parameter name is a repeated key, which JSON readers resolve to the last). A parameter the tool
declares as a string streams as its text arrives; any other value is read whole and then
converted (values.py). A call cut off mid-value keeps the part it has.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from smg.pipeline.parsers.tools.base import TEXT, ToolParser, find_first, partial_marker_len
from smg.pipeline.parsers.tools.values import dumps, param_types, value_json

# A tool name as the XML-style formats write it.
NAME = re.compile(r"[\w.\-:/]{1,256}")
# The attributes of an `<invoke name="f">` / `<parameter name="k">` tag (MiniMax, Step3).
_NAME_ATTR = re.compile(r"""\s+name\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))\s*""")


def name_attr(attrs: str) -> str:
    """The value of the only attribute, `name`, of a tag's attribute text ("" if it is not that)."""
    match = _NAME_ATTR.fullmatch(attrs)
    if not match:
        return ""
    return next(group for group in match.groups() if group is not None).strip()


class XmlCallParser(ToolParser):
    """A subclass reads the format's structure and calls `_open_xml_call`, then `_start_value`
    for each parameter; the value itself is read here (mode "value")."""

    # The strings that end a value; the first is the value's own closing tag (consumed), the
    # others close it implicitly when the model forgot that tag (left for the caller).
    value_ends: tuple[str, ...] = ()
    stream_strings = True
    after_value = "params"
    # A value written bare takes a newline it ends with, CRLF included, for the template's (as
    # `values.strip_newlines` does for a whole value); a format whose template writes its own
    # "\n" around every value gives up exactly that one character.
    crlf_closing = True
    # Whether the template puts a newline after the opening tag and before the closing one that
    # is not part of the value; a format that writes values verbatim keeps every character.
    value_newlines = True

    # The call being read: its parameters' declared types and how many members went out; the
    # parameter being read: its name, type, whether it streams, and what of it is held.
    _types: dict[str, str]
    _members = 0
    _key = ""
    _declared: str | None = None
    _streaming = False
    _value_begun = False
    _value: list[str]
    _holds: tuple[str, ...] = ()

    def _open_xml_call(self, name: str) -> None:
        self._open_call(name)
        self._types = param_types(self.tools, name)
        self._members = 0

    def _member(self, key: str) -> str:
        prefix = "{" if not self._members else ", "
        self._members += 1
        return prefix + dumps(key) + ": "

    def _close_xml_call(self) -> None:
        self._args("}" if self._members else "{}")
        self._close_call()

    def _start_value(self, key: str, declared: str | None = None) -> None:
        """Read the value of parameter `key`; its type is `declared` when the format writes one
        (the tool's schema decides otherwise)."""
        self._key = key
        self._declared = declared if declared is not None else self._types.get(key)
        self._streaming = self.stream_strings and self._declared == "string"
        self._value_begun = False
        self._value = []
        self._holds = self.value_ends
        if self.value_newlines:
            # The template's newline before the closing tag may be CRLF: hold it whole, drop it whole.
            newlines = ("\n", "\r\n") if self.crlf_closing else ("\n",)
            self._holds += tuple(nl + end for nl in newlines for end in self.value_ends)
        self.mode = "value"

    def _decode(self, text: str) -> str:
        return text

    def _step_value(self) -> bool:
        if self._streaming and not self._value_begun:
            if not self._buf or (self.value_newlines and self._buf == "\r"):
                return False
            self._args(self._member(self._key) + '"')
            self._value_begun = True
            if self.value_newlines and self._buf.startswith("\n"):
                self._consume(1)
            elif self.value_newlines and self._buf.startswith("\r\n"):
                self._consume(2)
            return True
        i, end = find_first(self._buf, self.value_ends)
        if i < 0:
            # Take all but what may start the closing (with the template's newline before it).
            hold = partial_marker_len(self._buf, self._holds)
            self._take_value(self._consume(len(self._buf) - hold))
            return False
        text = self._consume(i)
        if self._streaming:
            if self.value_newlines:
                text = _without_closing_newline(text, self.crlf_closing)
            self._args(_escaped(text) + '"')
        else:
            self._finish_value("".join(self._value) + text)
        if end == self.value_ends[0]:
            self._consume(len(end))
        self.mode = self.after_value
        return True

    def _take_value(self, text: str) -> None:
        if self._streaming:
            self._args(_escaped(text))
        elif text:
            self._value.append(text)

    def _finish_value(self, raw: str) -> None:
        self._args(self._member(self._key) + value_json(self._decode(raw), self._declared))

    def _abort_call(self) -> None:
        if self.mode == "value":
            rest = self._consume(len(self._buf))
            if not self._streaming:
                self._finish_value("".join(self._value) + rest)
            else:
                if not self._value_begun:
                    self._args(self._member(self._key) + '"')
                self._args(_escaped(rest) + '"')
        self._args("}" if self._members else "")

    def _tag_name(self) -> str | None:
        """The `name` attribute of the tag being read (its `<tag` already consumed), consumed
        through `>`; None while the tag is incomplete, "" (nothing consumed) when it has no
        usable name."""
        end = self._buf.find(">")
        if end < 0:
            return "" if len(self._buf) > 512 else None
        name = name_attr(self._buf[:end])
        if name:
            self._consume(end + 1)
        return name

    def _garbage(self, unread: str = "") -> None:
        """Something other than a parameter inside a call: the call ends there and the rest —
        with `unread`, the tag text read just before — is text."""
        self._close_xml_call()
        self._buf = unread + self._buf
        self._raw = []
        self.mode = TEXT
        self._pending_end = self.block_end

    def _read_name(self, ends: Callable[[str], bool]) -> str | None:
        """A tool name at the front of the buffer, consumed once `ends(rest)` accepts what
        follows it. None while undecided; "" when there is no name there."""
        match = NAME.match(self._buf)
        length = match.end() if match else 0
        rest = self._buf[length:]
        if not rest:
            return None
        if not length or not ends(rest):
            return ""
        return self._consume(length)


def _escaped(text: str) -> str:
    """`text` as the inside of a JSON string."""
    return dumps(text)[1:-1] if text else ""


def _without_closing_newline(text: str, crlf: bool) -> str:
    """A streamed value's last piece without the template's newline before the closing tag
    (as `values.strip_newlines` drops it from a whole value)."""
    if crlf and text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text
