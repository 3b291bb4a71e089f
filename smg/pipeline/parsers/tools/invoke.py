"""The invoke/parameter structure several formats share (`minimax_m2`, the DeepSeek DSML formats
`deepseek32` / `deepseek_v4`, Kimi-K3's XTML `kimi_k3`): a block of calls, each an opening tag
with the tool's name as an attribute, then one tagged element per parameter:

    BLOCK
    INVOKE name="get_weather">
    PARAMETER name="city">Paris END_PARAMETER
    END_INVOKE
    BLOCK_END

A format names its strings (what closes an opening tag, which attributes carry the tool name and
the parameter key) and may say how an attribute gives a value its type. A call opens as soon as
its opening tag is read; parameters become members of the arguments object (xmlish.py). With
`json_body`, a call may hold one JSON arguments object instead of parameters (bare, or inside a
`json_open` … `json_close` element), which streams as it arrives.
"""

from __future__ import annotations

import re
from typing import ClassVar

from smg.pipeline.parsers.tools import jsonstream as js
from smg.pipeline.parsers.tools.base import TEXT
from smg.pipeline.parsers.tools.xmlish import NAME, XmlCallParser

# One attribute: `key="v"`, `key='v'` or a bare `key=v`.
_ATTR = r"""(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))"""
_ATTRS = re.compile(rf"(?:\s+{_ATTR})*\s*")
_ONE_ATTR = re.compile(_ATTR)
# How far an opening tag may run before it is taken for something else.
_TAG_LIMIT = 512


def parse_attrs(text: str) -> dict[str, str] | None:
    """The attributes of an opening tag (the text between its name and its end); None when it is
    not a list of attributes."""
    if not _ATTRS.fullmatch(text):
        return None
    return {m.group(1): next(g for g in m.groups()[1:] if g is not None) for m in _ONE_ATTR.finditer(text)}


class InvokeParser(XmlCallParser):
    """A subclass names its strings (`block`, `invoke`, … with `value_ends`) and, where its
    format differs, how attributes are unescaped, which names are valid and how a parameter's
    attributes type its value."""

    block: ClassVar[str] = ""
    invoke: ClassVar[str] = ""
    end_invoke: ClassVar[str] = ""
    parameter: ClassVar[str] = ""
    end_parameter: ClassVar[str] = ""
    tag_end: ClassVar[str] = ">"
    name_attr: ClassVar[str] = "name"
    key_attr: ClassVar[str] = "name"
    json_body: ClassVar[bool] = False
    json_open: ClassVar[str] = ""
    json_close: ClassVar[str] = ""

    def _open(self, marker: str) -> None:
        self.mode = "block"

    def _value_type(self, key: str, attrs: dict[str, str]) -> str | None:
        """The type of a parameter's value by its tag's attributes (None: by the tool's schema)."""
        return None

    def _attr(self, value: str) -> str:
        """An attribute value as written → its text."""
        return value.strip()

    def _valid_name(self, name: str) -> bool:
        return NAME.fullmatch(name) is not None

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "value":
            return self._step_value()
        if mode == "json":
            if not self._step_args():
                return False
            self.mode = "json_end"
            return True
        if mode == "invoke" or mode == "parameter":
            required = self.key_attr if mode == "parameter" else self.name_attr
            attrs = self._tag_attrs(required)
            if attrs is None:
                return False
            if mode == "parameter":
                if attrs:
                    key = attrs[required]
                    self._start_value(key, self._value_type(key, attrs))
                else:
                    self._garbage(self.parameter)
            elif attrs and self._valid_name(attrs[required]):
                self._open_xml_call(attrs[required])
                self.mode = "params"
            else:
                self._broken()
            return True
        if mode == "json_tag":
            read = self._read_until((self.tag_end,), limit=_TAG_LIMIT)
            if read is None:
                return False
            tag, end = read
            if not end or parse_attrs(tag) is None:
                self._garbage(self.json_open + tag + end)
            else:
                self.mode = "json_start"
            return True
        if not self._skip_ws():
            return False
        if mode == "block":
            found = self._expect(self.invoke, self.block_end)
            if found == "":
                return False
            if found == self.invoke:
                self.mode = "invoke"
            elif found == self.block_end:
                self._end_block()
            else:
                self._broken()
            return True
        if mode == "json_start":
            if self._buf[0] == "{":
                self._stream = js.ArgsStream()
                self.mode = "json"
            else:
                self._garbage()
            return True
        if mode == "json_end":
            # After a JSON arguments object the call is closed: only closings may follow.
            found = self._expect(*filter(None, (self.json_close, self.end_invoke, self.block_end)))
            if found == "":
                return False
            self._raw = []
            if found == self.end_invoke:
                self.mode = "block"
            elif found == self.block_end:
                self.mode = TEXT
            elif found is None:  # other text: the block is over, and a closing marker later is dropped
                self.mode = TEXT
                self._pending_end = self.block_end
            # else the JSON element's closing, before the call's
            return True
        # "params": between parameters
        json_first = self.json_body and not self._members
        if json_first and not self.json_open and self._buf[0] == "{":
            self._stream = js.ArgsStream()
            self.mode = "json"
            return True
        json_open = (self.json_open,) if json_first and self.json_open else ()
        found = self._expect(self.parameter, self.end_invoke, self.block_end, *json_open)
        if found == "":
            return False
        if found and found == self.json_open:
            self.mode = "json_tag"
        elif found == self.parameter:
            self.mode = "parameter"
        elif found == self.end_invoke:
            self._close_xml_call()
            self.mode = "block"
        elif found == self.block_end:
            self._close_xml_call()
            self.mode = TEXT
        else:
            self._garbage()
        return True

    def _abort_call(self) -> None:
        if self._stream is not None:  # a JSON arguments object cut short
            self._args(self._stream.repair())
            self._stream = None
            return
        super()._abort_call()

    def _tag_attrs(self, required: str) -> dict[str, str] | None:
        """The attributes of the opening tag being read, consumed through its end; None while the
        tag is incomplete, {} (nothing consumed) when it has no non-empty `required` attribute."""
        end = self._buf.find(self.tag_end, 0, _TAG_LIMIT + len(self.tag_end))
        if end < 0:
            return {} if len(self._buf) > _TAG_LIMIT else None
        attrs = {key: self._attr(value) for key, value in (parse_attrs(self._buf[:end]) or {}).items()}
        if not attrs.get(required):
            return {}
        self._consume(end + len(self.tag_end))
        return attrs
