"""The SGLang request → llama.cpp body mapping and the GGUF reader, without an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from smg.engines.llamacpp.gguf import GGUFError, ModelFacts, read_metadata
from smg.engines.llamacpp.sampling import Refusal, plan


def request(ids: list[int] | None = None, **params: Any) -> Any:
    return pb.GenerateRequest(
        request_id="r",
        tokenized=pb.TokenizedInput(input_ids=ids if ids is not None else [1, 2, 3]),
        sampling_params=pb.SamplingParams(**params),
        stream=True,
    )


def test_sglang_s_neutral_values_switch_llamacpp_s_samplers_off() -> None:
    asked = plan(
        request(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, repetition_penalty=1.0, stop_token_ids=[7]),
        vocab_size=100,
        context_length=50,
    )
    body = asked.body
    assert body["prompt"] == [1, 2, 3] and body["stream"] is True and body["logprobs"] == 1
    assert (body["top_k"], body["top_p"], body["min_p"], body["repeat_penalty"]) == (0, 1.0, 0.0, 1.0)
    assert body["n_predict"] == -1 and asked.max_new_tokens is None
    assert asked.stop_token_ids == frozenset({7}) and "stop" not in body


def test_sampling_values_and_constraints_are_carried() -> None:
    asked = plan(
        request(temperature=0.0, top_p=0.9, top_k=40, max_new_tokens=12, json_schema='{"type": "object"}'),
        vocab_size=100,
        context_length=50,
    )
    assert (asked.body["temperature"], asked.body["top_p"], asked.body["top_k"]) == (0.0, pytest.approx(0.9), 40)
    assert asked.body["n_predict"] == 12 and asked.body["json_schema"] == {"type": "object"}
    grammar = plan(request(ebnf_grammar='root ::= "a"'), vocab_size=100, context_length=50)
    assert grammar.body["grammar"] == 'root ::= "a"'
    biased = plan(request(logit_bias={"5": -100.0}), vocab_size=100, context_length=50)
    assert biased.body["logit_bias"] == [[5, -100.0]]


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"ids": []}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"ids": list(range(50))}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"ids": [100]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"json_schema": '{"type": 3}'}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"logit_bias": {"x": 1.0}}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"regex": "a+"}, grpc.StatusCode.UNIMPLEMENTED),
        ({"structural_tag": "{}"}, grpc.StatusCode.UNIMPLEMENTED),
        ({"min_new_tokens": 3}, grpc.StatusCode.UNIMPLEMENTED),
        ({"n": 2}, grpc.StatusCode.UNIMPLEMENTED),
    ],
)
def test_refusals(changes: dict[str, Any], code: grpc.StatusCode) -> None:
    ids = changes.pop("ids", None)
    with pytest.raises(Refusal) as refused:
        plan(request(ids, **changes), vocab_size=100, context_length=50)
    assert refused.value.code == code


def test_the_reader_refuses_what_is_not_gguf(tmp_path: Path) -> None:
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(GGUFError):
        read_metadata(not_gguf)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (5).to_bytes(8, "little"))
    with pytest.raises(GGUFError):
        read_metadata(cut)


def test_the_facts_of_the_real_model(model_files: tuple[Path, Path]) -> None:
    facts = ModelFacts.of(read_metadata(model_files[0]))
    assert (facts.architecture, facts.context_length, facts.vocab_size) == ("llama", 8192, 49152)
    assert facts.eos_token_ids == [2, 0] and (facts.bos_token_id, facts.pad_token_id) == (1, 2)
    assert facts.chat_template is not None and "<|im_start|>" in facts.chat_template
