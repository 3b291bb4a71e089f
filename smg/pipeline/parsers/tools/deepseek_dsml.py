"""The DeepSeek DSML tool-call formats (behaviors.md §F.8 `deepseek32`, `deepseek_v4`), as the
models' encoders write them (`encoding_dsv32.py` of DeepSeek-V3.2, the V4 encoder):

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

V3.2's block is `function_calls`, V4's `tool_calls`; each parser reads only its own. A value
with `string="true"` is the string verbatim (no escaping, no added newlines) and streams as it
arrives; one with `string="false"` is JSON (a value that is not is kept as a string). Without
the attribute the tool's schema decides. An invoke may hold a JSON arguments object instead of
parameters.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools.invoke import InvokeParser

DSML = "｜DSML｜"
INVOKE = f"<{DSML}invoke"
END_INVOKE = f"</{DSML}invoke>"
PARAMETER = f"<{DSML}parameter"
END_PARAMETER = f"</{DSML}parameter>"


def _block(name: str) -> tuple[str, str]:
    return f"<{DSML}{name}>", f"</{DSML}{name}>"


class DeepSeekV32Parser(InvokeParser):
    name = "deepseek32"
    block, block_end = _block("function_calls")
    start_markers = (block,)
    invoke = INVOKE
    end_invoke = END_INVOKE
    parameter = PARAMETER
    end_parameter = END_PARAMETER
    value_ends = (END_PARAMETER, PARAMETER, END_INVOKE, block_end)
    value_newlines = False
    json_body = True

    def _value_type(self, key: str, attrs: dict[str, str]) -> str | None:
        string = attrs.get("string")
        if string == "true":
            return "string"
        # "json": whatever JSON value it is (values.value_json infers it).
        return "json" if string == "false" else None


class DeepSeekV4Parser(DeepSeekV32Parser):
    name = "deepseek_v4"
    block, block_end = _block("tool_calls")
    start_markers = (block,)
    value_ends = (END_PARAMETER, PARAMETER, END_INVOKE, block_end)
