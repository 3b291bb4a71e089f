"""The MiniMax-M2 tool-call format (behaviors.md §F.8 `minimax_m2`):

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

One block may hold several `<invoke>`s, each a call (invoke.py). Values are XML-escaped
(`&lt;` …), so they are unescaped, then converted by the tool's schema (values.py); being
unescaped, they are read whole rather than streamed.
"""

from __future__ import annotations

import re

from smg.pipeline.parsers.tools.invoke import InvokeParser

START = "<minimax:tool_call>"
END = "</minimax:tool_call>"
INVOKE = "<invoke"
END_INVOKE = "</invoke>"
PARAMETER = "<parameter"
END_PARAMETER = "</parameter>"

_ENTITY = re.compile(r"&(lt|gt|amp|quot|apos);")
_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}


class MinimaxM2Parser(InvokeParser):
    name = "minimax_m2"
    start_markers = (START,)
    block = START
    block_end = END
    invoke = INVOKE
    end_invoke = END_INVOKE
    parameter = PARAMETER
    end_parameter = END_PARAMETER
    value_ends = (END_PARAMETER, PARAMETER, END_INVOKE, END)
    stream_strings = False

    def _decode(self, text: str) -> str:
        return _ENTITY.sub(lambda match: _ENTITIES[match.group(1)], text)
