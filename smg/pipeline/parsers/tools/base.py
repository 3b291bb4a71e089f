"""The machinery every tool-call parser shares: a text stage that turns generated text into
`Text`, `ToolCall` and `ToolArgs` pieces (behaviors.md §C.2, §D.2, §F.8).

A parser reads its buffer from the front and decides as soon as the text allows:

* Outside calls, text goes out at once except for a tail that could still become one of the
  format's start markers ("Hello <tool" holds only "<tool").
* From a start marker on, the text is a *prospective* call, held verbatim. It becomes a call —
  `ToolCall(id, name)` — once the name is known and the arguments have begun. If it breaks
  before that, or the output ends first, the marker goes out as text and the rest is read again
  as ordinary text, so nothing is lost and later markers still count (smg#2271).
* Once a call is open its arguments go out as `ToolArgs` fragments whose concatenation is one
  JSON object. A call that breaks or is cut off is closed with what it has (or `{}`), and the
  rest of the text is read as ordinary text again.
* Whitespace before the first call, between calls and after them is dropped; other text after
  a call is passed on as `Text` (the block builder decides where it goes). Whitespace at the very
  start of the output is held until it is known not to precede a call.
* Pieces other than `Text` pass through where they are; held text stays held.

Calls to tool names the request did not declare are kept as calls: the client, which knows its
tools, decides what to do with them.

Ids are `toolu_` + 24 hex characters, random unless the caller passes `new_id` (which gets the
call's index in the output — the seam for ids derived from the message id).
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from smg.pipeline.generation import Piece, Text, ToolArgs, ToolCall
from smg.pipeline.parsers.tools import jsonstream as js

Tools = list[dict[str, Any]]
IdFactory = Callable[[int], str]

TEXT = "text"  # the mode every parser starts in


def random_tool_use_id(index: int = 0) -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def client_tool_use_id(parser_id: str) -> str:
    """A model-written id as the client sees it (§C.2): `call_X` → `toolu_X`, others unchanged."""
    return "toolu_" + parser_id[5:] if parser_id.startswith("call_") else parser_id


def tool_names(tools: Tools) -> frozenset[str]:
    return frozenset(name for tool in tools if isinstance(name := _function(tool).get("name"), str))


def tool_schema(tools: Tools, name: str) -> dict[str, Any]:
    """The JSON schema of the named tool's input (`{}` when unknown)."""
    for tool in tools:
        function = _function(tool)
        if function.get("name") == name:
            schema = function.get("parameters", function.get("input_schema"))
            return schema if isinstance(schema, dict) else {}
    return {}


def _function(tool: Any) -> dict[str, Any]:
    """The function part of an OpenAI-style tool (an Anthropic-style tool is its own)."""
    if not isinstance(tool, dict):
        return {}
    function = tool.get("function", tool)
    return function if isinstance(function, dict) else {}


def partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `markers`."""
    if not text or not markers:
        return 0
    longest, firsts = _marker_shape(markers)
    for j in range(max(0, len(text) - longest + 1), len(text)):
        if text[j] in firsts:
            tail = text[j:]
            if any(len(tail) < len(marker) and marker.startswith(tail) for marker in markers):
                return len(text) - j
    return 0


@functools.cache
def _marker_shape(markers: tuple[str, ...]) -> tuple[int, frozenset[str]]:
    return max(map(len, markers)), frozenset(marker[0] for marker in markers if marker)


def find_first(text: str, markers: Sequence[str], start: int = 0) -> tuple[int, str]:
    """The earliest (then longest) of `markers` in `text`, as (index, marker); (-1, "") if none."""
    best, found = -1, ""
    for marker in markers:
        i = text.find(marker, start)
        if i >= 0 and (best < 0 or i < best or (i == best and len(marker) > len(found))):
            best, found = i, marker
    return best, found


class ToolParser:
    """Base of the format parsers. A subclass names its start markers and implements `_open`
    (what a start marker begins) and `_step_mode` (one step of reading in its other modes)."""

    name: ClassVar[str] = ""
    start_markers: ClassVar[tuple[str, ...]] = ()
    # Characters dropped, besides whitespace, between calls (llama's `;`).
    separators: ClassVar[str] = ""
    # The closing marker of the format's block of calls, if it has one: dropped where it follows
    # a call of a block that broke.
    block_end: ClassVar[str] = ""

    def __init__(self, tools: Tools | None = None, *, new_id: IdFactory | None = None) -> None:
        self.tools: Tools = list(tools or [])
        self._new_id = new_id or random_tool_use_id
        self.calls = 0
        self.mode = TEXT
        self._buf = ""
        self._out: list[Piece] = []
        self._final = False
        # Text bookkeeping.
        self._lead = ""
        self._seen_text = False
        self._after_call = False
        self._pending_end = ""
        # The current prospective call: its marker, the text read since, and whether it opened.
        self._marker = ""
        self._raw: list[str] = []
        self._committed = False
        self._in_call = False
        self._args_sent = False
        self._json: js.JsonCall | None = None
        self._stream: js.ArgsStream | None = None

    # --- the stage ------------------------------------------------------------------------------

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        for piece in pieces:
            if isinstance(piece, Text):
                if piece.text:
                    self._buf += piece.text
                    self._run()
            else:
                self._out.append(piece)
        return self._drain()

    def flush(self) -> list[Piece]:
        self._final = True
        self._run()
        if self._lead and not self.calls:
            self._out.append(Text(self._lead))
        self._lead = ""
        return self._drain()

    def _drain(self) -> list[Piece]:
        out: list[Piece] = []
        for piece in self._out:
            if out and isinstance(piece, Text) and isinstance(out[-1], Text):
                out[-1] = Text(out[-1].text + piece.text)
            elif out and isinstance(piece, ToolArgs) and isinstance(out[-1], ToolArgs):
                out[-1] = ToolArgs(out[-1].fragment + piece.fragment)
            else:
                out.append(piece)
        self._out = []
        return out

    def _run(self) -> None:
        while True:
            progressed = self._step_text() if self.mode == TEXT else self._step_mode()
            if not progressed:
                if self._final and (self.mode != TEXT or self._buf):
                    self._give_up()
                    continue
                return

    # --- reading ordinary text ------------------------------------------------------------------

    def _markers(self) -> tuple[str, ...]:
        return self.start_markers + ((self._pending_end,) if self._pending_end else ())

    def _step_text(self) -> bool:
        if not self._buf:
            return False
        markers = self._markers()
        i, marker = find_first(self._buf, markers)
        if i >= 0:
            self._text(self._buf[:i])
            self._buf = self._buf[i + len(marker) :]
            if marker == self._pending_end:
                self._pending_end = ""
            else:
                self._pending_end = ""
                self._begin(marker)
            return True
        keep = 0 if self._final else partial_marker_len(self._buf, markers)
        if keep == len(self._buf):
            return False
        self._text(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._after_call:
            text = text.lstrip(" \t\r\n" + self.separators)
            if not text:
                return
            self._after_call = False
        if not self._seen_text:
            if not text.strip():
                self._lead += text
                return
            text, self._lead = self._lead + text, ""
            self._seen_text = True
        self._out.append(Text(text))

    @property
    def _at_start(self) -> bool:
        """Only whitespace so far, or just after a call: where the marker-less formats look."""
        return not self._seen_text or self._after_call

    # --- prospective calls ----------------------------------------------------------------------

    def _begin(self, marker: str) -> None:
        self._marker = marker
        self._raw = [marker]
        self._committed = False
        self._open(marker)

    def _open(self, marker: str) -> None:
        raise NotImplementedError

    def _step_mode(self) -> bool:
        raise NotImplementedError

    def _consume(self, n: int) -> str:
        taken, self._buf = self._buf[:n], self._buf[n:]
        self._raw.append(taken)
        return taken

    def _skip_ws(self) -> bool:
        """Consume leading whitespace; True if something other than whitespace is next."""
        n = len(self._buf) - len(self._buf.lstrip(js.WHITESPACE))
        if n:
            self._consume(n)
        return bool(self._buf)

    def _expect(self, *options: str) -> str | None:
        """Which of `options` the buffer starts with (consumed); "" when it is still only a
        prefix of one of them, None when it cannot be any."""
        for option in options:
            if self._buf.startswith(option):
                self._consume(len(option))
                return option
        if any(option.startswith(self._buf) for option in options):
            return ""
        return None

    def _read_until(self, terminators: Sequence[str], limit: int | None = None) -> tuple[str, str] | None:
        """(text before, terminator) with both consumed, once a terminator is in the buffer.
        None while it is not; "" as terminator when `limit` characters passed without one."""
        i, term = find_first(self._buf, terminators)
        if i < 0:
            if limit is not None and len(self._buf) > limit:
                return "", ""
            return None
        if limit is not None and i > limit:
            return "", ""
        text = self._consume(i)
        self._consume(len(term))
        return text, term

    def _name_then(self, pattern: re.Pattern[str], sep: str) -> str | None:
        """A name matching `pattern` at the front of the buffer followed by `sep` (whitespace
        allowed around the name); both consumed. None while undecided, "" when it is not
        there."""
        body = self._buf.lstrip(js.WHITESPACE)
        match = pattern.match(body)
        length = match.end() if match else 0
        rest = body[length:].lstrip(js.WHITESPACE)
        if not rest or (sep.startswith(rest) and len(rest) < len(sep)):
            return None
        if not length or not rest.startswith(sep):
            return ""
        self._consume(len(self._buf) - len(rest) + len(sep))
        return body[:length]

    def _fail(self) -> None:
        """The structure being read broke. Before any call of it opened, its marker is text and
        the rest is read again; after, what was read since the last call is text."""
        if self._committed:
            self._as_text()
            return
        rest = "".join(self._raw)[len(self._marker) :]
        self._text(self._marker)
        self._buf = rest + self._buf
        self._raw = []
        self.mode = TEXT

    def _broken(self) -> None:
        """The block of calls broke (`_fail`); after a call of it opened, its closing marker is
        still to come and is not text."""
        if self._committed and self.block_end:
            self._pending_end = self.block_end
        self._fail()

    def _as_text(self) -> None:
        """What was read since the marker (or the last call) is text after all."""
        self._text("".join(self._raw))
        self._raw = []
        self.mode = TEXT

    def _end_block(self) -> None:
        """The closing marker of a block of calls: a block without any is text."""
        if self._committed:
            self._raw = []
            self.mode = TEXT
        else:
            self._as_text()

    def _step_between_calls(self, call_begin: str, call_end: str, *block_ends: str) -> bool:
        """Between the calls of a marked block: the next call's `call_begin` (mode "head"), one
        of the `block_ends`, or a finished call's `call_end` (dropped); anything else breaks it."""
        found = self._expect(call_begin, *block_ends, call_end)
        if found == "":
            return False
        if found == call_begin:
            self.mode = "head"
        elif found in block_ends:
            self._end_block()
        elif found == call_end and self._committed:
            self._raw = []  # the finished call's closing marker
        elif found is None:
            self._broken()
        return True

    def _give_up(self) -> None:
        """The output ended mid-structure."""
        if self._in_call:
            self._abort_call()
            self._close_call()
            self.mode = TEXT
        elif self.mode != TEXT:
            self._fail()

    def _abort_call(self) -> None:
        """Emit the rest of a call that is cut short (what was safe, then its closing)."""
        if self._json is not None:
            self._args(self._json.repair())
            self._json = None
        if self._stream is not None:
            self._args(self._stream.repair())
            self._stream = None

    # --- calls ----------------------------------------------------------------------------------

    def _open_call(self, name: str, tool_id: str | None = None) -> None:
        self._out.append(ToolCall(client_tool_use_id(tool_id) if tool_id else self._new_id(self.calls), name))
        self.calls += 1
        self._committed = True
        self._raw = []
        self._in_call = True
        self._args_sent = False
        self._lead = ""
        self._after_call = True

    def _args(self, fragment: str) -> None:
        if fragment:
            self._out.append(ToolArgs(fragment))
            self._args_sent = True

    def _close_call(self) -> None:
        if not self._args_sent:
            self._out.append(ToolArgs("{}"))
        self._in_call = False
        self._after_call = True
        self._raw = []

    # --- JSON call objects ----------------------------------------------------------------------

    def _start_json(self, name_keys: tuple[str, ...] = ("name",)) -> None:
        self._json = js.JsonCall(name_keys=name_keys)

    def _accept(self, call: js.JsonCall) -> bool:
        """Whether a call object read so far may open a tool call (its name is known)."""
        return call.args_started or call.done

    def _step_json(self) -> bool | None:
        """Read the buffer into the current call object, opening the tool call once `_accept`
        agrees and streaming the arguments. None while the object goes on; True once it ended
        as a call (closed; a character that broke it stays in the buffer); False once it ended
        as no call (already turned back into text)."""
        call = self._json
        assert call is not None
        status, n = call.feed(self._buf)
        self._consume(n)
        if not self._in_call and call.name is not None and self._accept(call):
            self._open_call(call.name)
        if self._in_call:
            self._args(call.take())
        if status != js.DONE and status != js.ERROR:
            return None
        self._json = None
        if self._in_call:
            if status == js.DONE:
                self._args(call.final_args())
                self._close_call()
            else:
                self._args(call.repair())
                pending = call.pending()
                self._close_call()
                self._text(pending)
            return True
        if status == js.DONE:
            self._as_text()
        else:
            self._fail()
        return False

    # --- bare arguments objects -----------------------------------------------------------------

    def _start_args(self, name: str, tool_id: str | None = None) -> None:
        """Open the call; its arguments object starts at the front of the buffer (`{`)."""
        self._open_call(name, tool_id)
        self._stream = js.ArgsStream()

    def _step_open_args(self, name: str, tool_id: str | None = None) -> bool:
        """The named call's arguments object is next (mode "open_args"; whitespace before it is
        dropped): the call opens and the mode is "args". Anything else breaks the block."""
        if not self._skip_ws():
            return False
        if self._buf[0] != "{":
            self._broken()
            return True
        self._start_args(name, tool_id)
        self.mode = "args"
        return True

    def _step_args(self) -> bool:
        """Stream the buffer into the arguments object; True once it ended (complete, or broken
        by a character left in the buffer) and the call is closed."""
        stream = self._stream
        assert stream is not None
        status, n = stream.feed(self._buf)
        self._consume(n)
        self._args(stream.take())
        if status != js.DONE and status != js.ERROR:
            return False
        self._stream = None
        pending = ""
        if status == js.ERROR:
            self._args(stream.repair())
            pending = stream.pending()
        self._close_call()
        self._text(pending)
        return True
