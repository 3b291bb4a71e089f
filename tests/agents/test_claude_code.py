"""Claude Code completes a tool loop through the gateway's gRPC path.

The real `claude` CLI runs non-interactively (`-p`) with `ANTHROPIC_BASE_URL` at a gateway in front
of a scripted SGLang engine serving the Qwen3 fixture tokenizer, every model name pointing at
that engine's model. The engine answers by prompt rules: the user's request gets a Hermes-style
`<tool_call>` for the Bash tool, which the gateway parses into a `tool_use` block; Claude Code
runs the command and sends the `tool_result` back; the prompt that carries it (a
`<tool_response>` turn in the Qwen3 template) gets the final text. Anything else Claude Code
asks on the side gets a neutral default answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from journal import threads
from journal.events import Block, Event, Received
from journal.reader import JournalReader
from tests.agents.conftest import MODEL, QWEN3
from tests.conftest import wait_for_events
from tools.engine_control import EngineControl
from tools.spawn import Spawned

MARKER = "smg-roundtrip-42"
COMMAND = f"echo {MARKER} | tee out.txt"
PROMPT = f"Run `{COMMAND}` with the Bash tool, then tell me what it printed."
TOOL_CALL = (
    "<tool_call>\n"
    + json.dumps({"name": "Bash", "arguments": {"command": COMMAND, "description": "Write the marker file"}})
    + "\n</tool_call>"
)
FINAL = f"The command printed {MARKER} and wrote it to out.txt."
SIDE_ANSWER = "Side answer."
TOOL_RESPONSE = f"<tool_response>\n{MARKER}\n</tool_response>"
RUN_TIMEOUT = 120.0


def claude_env(gateway: Spawned, home: Path) -> dict[str, str]:
    """A clean environment: nothing from the caller's Claude Code set-up, every model ours."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "SHELL": shutil.which("bash") or "/bin/bash",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": gateway.url,
        "ANTHROPIC_API_KEY": "sk-ant-smg-test",
        "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
        "CLAUDE_CODE_SUBAGENT_MODEL": MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


def run_claude(argv: list[str], gateway: Spawned, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    args = [
        *argv,
        "-p",
        PROMPT,
        "--output-format",
        "stream-json",
        "--verbose",
        "--allowedTools",
        "Bash",
        "--max-turns",
        "3",
    ]
    done = subprocess.run(
        args,
        cwd=work,
        env=claude_env(gateway, home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    return done, work


def stream_messages(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip().startswith("{")]


def conversation(messages: list[dict[str, Any]]) -> str:
    """Claude Code's stream-json output without its long `init` message, for failure reports."""
    lines = []
    for m in messages:
        if m.get("type") in ("assistant", "user"):
            lines.append(f"{m['type']}: {json.dumps(m['message'].get('content'))[:1500]}")
        elif m.get("type") == "result":
            lines.append(f"result: {json.dumps({k: m.get(k) for k in ('subtype', 'is_error', 'num_turns', 'result')})}")
        else:
            lines.append(f"{m.get('type')}/{m.get('subtype')}")
    return "\n".join(lines)


def journaled(journal: Path) -> list[tuple[dict[str, Any], list[Event]]]:
    """Every request the gateway journaled, oldest first, once complete: its row and its events."""
    with JournalReader(journal) as reader:
        rows = reader.list_requests(limit=1000, newest_first=False)
    out = []
    for row in rows:
        events = wait_for_events(journal, row["id"])
        with JournalReader(journal) as reader:
            out.append((reader.get_request(row["id"]) or row, events))
    return out


def request_body(events: list[Event]) -> dict[str, Any]:
    received = next(e for e in events if isinstance(e, Received))
    return json.loads(received.body or "{}")


def tool_use_ids(events: list[Event]) -> list[str]:
    return [
        e.event["content_block"]["id"]
        for e in events
        if isinstance(e, Block)
        and e.event.get("type") == "content_block_start"
        and e.event["content_block"].get("type") == "tool_use"
    ]


def engine_prompts(control: EngineControl) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(QWEN3))
    return [
        tokenizer.decode([int(i) for i in r["tokenized"]["input_ids"]], skip_special_tokens=False)
        for r in control.received()
    ]


def test_claude_code_runs_a_bash_tool_loop(
    claude_code: list[str],
    agent_gateway: Spawned,
    agent_journal: Path,
    agent_control: EngineControl,
    tmp_path: Path,
) -> None:
    agent_control.script(
        {"text": FINAL, "when_prompt_contains": TOOL_RESPONSE},  # the turn that carries the tool result
        {"text": TOOL_CALL, "when_prompt_contains": PROMPT},  # the user's request
        default={"text": SIDE_ANSWER},
    )
    done, work = run_claude(claude_code, agent_gateway, tmp_path)
    messages = stream_messages(done.stdout)
    said = f"exit {done.returncode}\n{conversation(messages)}\nstderr:\n{done.stderr[-2000:]}"
    assert done.returncode == 0, f"{said}\nstdout:\n{done.stdout[-3000:]}\ngateway log:\n{agent_gateway.log()[-3000:]}"

    # Claude Code's own account: it called Bash, got the output back, and ended with our text.
    uses = [
        block
        for m in messages
        if m.get("type") == "assistant"
        for block in m["message"]["content"]
        if block["type"] == "tool_use"
    ]
    assert [(u["name"], u["input"].get("command")) for u in uses] == [("Bash", COMMAND)], said
    results = [
        block
        for m in messages
        if m.get("type") == "user" and isinstance(m["message"]["content"], list)
        for block in m["message"]["content"]
        if block["type"] == "tool_result"
    ]
    assert [r["tool_use_id"] for r in results] == [uses[0]["id"]], said
    assert not results[0].get("is_error") and MARKER in json.dumps(results[0]["content"]), said
    result = messages[-1]
    assert result["type"] == "result" and result["subtype"] == "success" and not result["is_error"], said
    assert result["result"] == FINAL, said
    assert result["num_turns"] == 2, said

    # The tool really ran.
    assert (work / "out.txt").read_text() == f"{MARKER}\n"

    # The gateway answered every request; the main loop is the two requests with tools.
    requests = journaled(agent_journal)
    refused = [(row["path"], row["status"], row["error_type"], row["error_code"]) for row, _ in requests]
    assert all(row["status"] == 200 for row, _ in requests), refused
    loop = [(row, events) for row, events in requests if request_body(events).get("tools")]
    assert len(loop) == 2, refused
    (first, first_events), (second, second_events) = loop
    assert first["model"] == MODEL and first["stop_reason"] == "tool_use" and first["has_tool_use"]
    assert tool_use_ids(first_events) == [uses[0]["id"]]
    sent_back = request_body(second_events)["messages"][-1]["content"]
    tool_results = [b for b in sent_back if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert [b["tool_use_id"] for b in tool_results] == [uses[0]["id"]]
    assert MARKER in json.dumps(tool_results[0].get("content"))
    assert second["stop_reason"] == "end_turn"

    # The two turns are one conversation, and the second added the tool call and its result.
    with JournalReader(agent_journal) as reader:
        turns = threads.thread(reader, second["id"])
    assert turns is not None and first["thread_key"] == second["thread_key"]
    by_id = {turn.id: turn for turn in turns}
    assert [t.id for t in turns].index(first["id"]) < [t.id for t in turns].index(second["id"])
    step = by_id[second["id"]]
    assert not step.rewritten, step.summary()
    added = [b.get("type") for m in step.added if isinstance(m.get("content"), list) for b in m["content"]]
    assert "tool_use" in added and "tool_result" in added, step.added

    # The engine saw the tool call and its result rendered back into the prompt, as Qwen3 has them.
    prompts = engine_prompts(agent_control)
    with_result = [p for p in prompts if TOOL_RESPONSE in p]
    assert len(with_result) == 1, [p[-400:] for p in prompts]
    prompt = with_result[0]
    call_at = prompt.rfind('<|im_start|>assistant\n<tool_call>\n{"name": "Bash"')
    assert call_at != -1, prompt[-1500:]
    assert COMMAND in prompt[call_at:]
    answer_at = prompt.index(TOOL_RESPONSE)
    assert answer_at > call_at
    assert "<|im_start|>assistant\n" in prompt[answer_at:], prompt[answer_at:]  # the generation prompt follows
