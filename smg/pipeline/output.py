"""How one request's output is read: which parsers run, whether tool use is forced by a
constraint, and how the engine's tokens are detokenized (spec §F.3, §F.6, §F.7).

`plan_output` decides once per request from the request, its rendered prompt and the model
id; the decision is recorded in the generation settings (and so in the journal), and
`build_stages` turns those settings back into the text stages, so a recomputation from the
journal runs exactly the stages the live request ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smg.pipeline.constraints import Constraint, tool_constraint
from smg.pipeline.forced import ForcedToolStage
from smg.pipeline.generation import GenerationSettings, TextStage
from smg.pipeline.ids import tool_use_id
from smg.pipeline.parsers.reasoning import (
    detect_reasoning_parser,
    make_reasoning_parser,
    needs_special_tokens,
    start_in_prompt,
    starts_in_reasoning,
)
from smg.pipeline.parsers.tools import detect_tool_parser, has_tool_parser, make_tool_parser
from smg.pipeline.render import Prompt


@dataclass
class OutputPlan:
    tool_parser: str | None = None  # None: no tool parsing
    reasoning_parser: str | None = None  # None: no reasoning parsing
    in_reasoning: bool = False
    start_consumed: bool = False  # the template wrote the reasoning start marker itself
    forced_tool: str | None = None  # tool_choice tool under a json_schema constraint
    constraint: Constraint | None = None
    skip_special_tokens: bool = True
    display_omitted: bool = False


def plan_output(
    request: Any,
    prompt: Prompt,
    model: str,
    *,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> OutputPlan:
    """`tool_parser`/`reasoning_parser` are the operator's explicit choices (flags); without
    them the parsers are detected from the model id."""
    plan = OutputPlan()
    choice = getattr(request.tool_choice, "type", None)
    tools = prompt.tools if choice != "none" else None
    if tools:
        forced_name = getattr(request.tool_choice, "name", None)
        plan.constraint = tool_constraint(choice, forced_name, tools, configured_parser=tool_parser)
        if plan.constraint is not None and plan.constraint[0] == "json_schema":
            # The engine writes JSON: `any` an array of {name, parameters}, `tool` the input object.
            plan.skip_special_tokens = True
            if choice == "tool":
                plan.forced_tool = forced_name
            else:
                plan.tool_parser = "json"
        else:
            tool_name = tool_parser or detect_tool_parser(model)
            plan.tool_parser = tool_name if has_tool_parser(tool_name) else None
            # The parsers look for the model's own markers, some of which are special tokens.
            plan.skip_special_tokens = plan.tool_parser is None

    thinking = getattr(request, "thinking", None)
    reasoning_name = reasoning_parser or detect_reasoning_parser(model)
    # A format whose channels are special tokens is read whatever thinking is set to: its
    # markers are kept, and its reasoning parser takes them out of the text.
    structural = reasoning_name is not None and needs_special_tokens(reasoning_name)
    if structural or (getattr(thinking, "type", None) != "disabled" and prompt.thinking is not False):
        if reasoning_name is not None and reasoning_name != "passthrough":
            plan.reasoning_parser = reasoning_name
            plan.in_reasoning = starts_in_reasoning(reasoning_name, prompt.thinking, prompt.text)
            plan.start_consumed = start_in_prompt(reasoning_name, prompt.text)
    if structural:
        plan.skip_special_tokens = False
    plan.display_omitted = getattr(thinking, "display", None) == "omitted"
    return plan


def apply_plan(settings: GenerationSettings, plan: OutputPlan, tools: list[dict[str, Any]] | None) -> None:
    settings.tool_parser = plan.tool_parser
    settings.reasoning_parser = plan.reasoning_parser
    settings.in_reasoning = plan.in_reasoning
    settings.start_consumed = plan.start_consumed
    settings.forced_tool = plan.forced_tool
    settings.skip_special_tokens = plan.skip_special_tokens
    settings.display_omitted = plan.display_omitted
    settings.tools = tools if (plan.tool_parser or plan.forced_tool) else None


def build_stages(settings: GenerationSettings) -> list[TextStage]:
    """The text stages for these settings: reasoning first, then tool calls."""
    stages: list[TextStage] = []
    if settings.reasoning_parser:
        stages.append(
            make_reasoning_parser(
                settings.reasoning_parser, settings.in_reasoning, start_consumed=settings.start_consumed
            )
        )
    if settings.forced_tool:
        stages.append(ForcedToolStage(settings.forced_tool, settings.stream))
    elif settings.tool_parser:
        message_id = settings.message_id
        stages.append(
            make_tool_parser(settings.tool_parser, settings.tools, new_id=lambda i: tool_use_id(message_id, i))
        )
    return stages
