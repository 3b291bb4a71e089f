"""`smg engine llamacpp` on its own wire: the SGLang scheduler service as a client of it sees it."""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from smg.pipeline.tokenizers.tokenizer import Tokenizer
from tests.llamacpp.conftest import HELLO, MODEL, Engine
from tools.spawn import Spawned, spawn_gateway


def prompt_ids(model_files: tuple[Path, Path], text: str = HELLO) -> list[int]:
    tokenizer = Tokenizer.load(model_files[1])
    rendered = tokenizer._hf.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(rendered)


def generate(ids: list[int], request_id: str, *, stream: bool = True, **params: Any) -> Any:
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, **params}
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


def responses(engine: Engine, request: Any) -> tuple[list[Any], Any]:
    """(the chunks, the complete) of one Generate."""
    chunks, complete = [], None
    for response in engine.stub.Generate(request, timeout=60):
        if response.WhichOneof("response") == "chunk":
            chunks.append(response.chunk)
        else:
            complete = response.complete
    assert complete is not None
    return chunks, complete


def test_model_info_comes_from_the_gguf(engine: Engine, model_files: tuple[Path, Path]) -> None:
    info = engine.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.served_model_name == MODEL and Path(info.model_path) == model_files[0].resolve()
    assert (info.max_context_length, info.vocab_size, info.model_type) == (8192, 49152, "llama")
    assert list(info.eos_token_ids)[0] == 2 and info.bos_token_id == 1
    assert list(info.architectures) == ["LlamaForCausalLM"] and info.is_generation
    assert engine.stub.HealthCheck(pb.HealthCheckRequest(), timeout=10).healthy
    loads = engine.stub.GetLoads(pb.GetLoadsRequest(), timeout=10)
    assert loads.loads[0].max_running_requests == 4


def test_a_stream_carries_ids_and_running_totals_and_ends_on_eos(
    engine: Engine, model_files: tuple[Path, Path]
) -> None:
    ids = prompt_ids(model_files)
    chunks, complete = responses(engine, generate(ids, "eos-stream", max_new_tokens=64))
    streamed = [t for c in chunks for t in c.token_ids]
    assert [c.completion_tokens for c in chunks] == list(range(1, len(chunks) + 1))
    assert all(c.prompt_tokens == len(ids) for c in chunks)
    assert (complete.finish_reason, complete.matched_token_id) == ("stop", 2)
    assert streamed[-1] == 2 and complete.completion_tokens == len(streamed)
    assert list(complete.output_ids) == list(chunks[-1].token_ids)  # SGLang repeats the last chunk
    _, whole = responses(engine, generate(ids, "eos-plain", stream=False, max_new_tokens=64))
    assert list(whole.output_ids) == streamed  # greedy: the same ids, all in the one `complete`


def test_a_stop_token_id_ends_the_output_on_it(engine: Engine, model_files: tuple[Path, Path]) -> None:
    ids = prompt_ids(model_files)
    _, free = responses(engine, generate(ids, "free", stream=False, max_new_tokens=16, ignore_eos=True))
    stop = free.output_ids[3]
    first = list(free.output_ids).index(stop)
    _, stopped = responses(
        engine, generate(ids, "stop-id", stream=False, max_new_tokens=16, ignore_eos=True, stop_token_ids=[stop])
    )
    assert (stopped.finish_reason, stopped.matched_token_id) == ("stop", stop)
    assert list(stopped.output_ids) == list(free.output_ids[: first + 1])


def test_abort_ends_a_stream_with_finish_reason_abort(engine: Engine, model_files: tuple[Path, Path]) -> None:
    engine.wait_idle()
    call = engine.stub.Generate(generate(prompt_ids(model_files), "to-abort", max_new_tokens=4000, ignore_eos=True))
    seen = 0
    complete = None
    for response in call:
        if response.WhichOneof("response") == "chunk":
            seen += 1
            if seen == 3:
                answer = engine.stub.Abort(pb.AbortRequest(request_id="to-abort"), timeout=10)
                assert answer.success
        else:
            complete = response.complete
    assert complete is not None and complete.finish_reason == "abort"
    assert 3 <= complete.completion_tokens < 4000
    assert not engine.stub.Abort(pb.AbortRequest(request_id="to-abort"), timeout=10).success


def test_a_cancelled_call_ends_the_generation(engine: Engine, model_files: tuple[Path, Path]) -> None:
    engine.wait_idle()
    before = engine.generated_tokens()
    call = engine.stub.Generate(generate(prompt_ids(model_files), "cancelled", max_new_tokens=4000, ignore_eos=True))
    for index, _ in enumerate(call):
        if index == 4:
            call.cancel()
            break
    engine.wait_idle()
    assert 5 <= engine.generated_tokens() - before < 1000


def test_constrained_decoding_follows_the_json_schema(engine: Engine, model_files: tuple[Path, Path]) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    request = generate(
        prompt_ids(model_files, "Give the weather in Paris for 3 days."), "schema", stream=False, max_new_tokens=48
    )
    request.sampling_params.json_schema = json.dumps(schema)
    _, complete = responses(engine, request)
    text = Tokenizer.load(model_files[1]).decode(list(complete.output_ids))
    value = json.loads(text)
    assert set(value) == {"city", "days"} and isinstance(value["days"], int)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"ids": []}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"ids": [5] * 9000}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"ids": [49152]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"json_schema": '{"type": "bogus"}'}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"json_schema": "{not json"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"regex": "[a-z]+"}, grpc.StatusCode.UNIMPLEMENTED),
        ({"n": 2}, grpc.StatusCode.UNIMPLEMENTED),
    ],
)
def test_what_the_engine_cannot_run_is_refused(engine: Engine, change: dict[str, Any], code: grpc.StatusCode) -> None:
    ids = change.pop("ids", [1, 4093, 198, 28120, 2, 198])
    request = generate(ids, "refused", max_new_tokens=4, **{k: v for k, v in change.items() if k == "n"})
    for key in ("json_schema", "regex"):
        if key in change:
            setattr(request.sampling_params, key, change[key])
    with pytest.raises(grpc.RpcError) as raised:
        responses(engine, request)
    assert raised.value.code() == code


def test_max_new_tokens_zero_answers_at_once(engine: Engine) -> None:
    chunks, complete = responses(engine, generate([1, 4093, 198], "zero", max_new_tokens=0))
    assert chunks == [] and (complete.finish_reason, complete.completion_tokens) == ("length", 0)


def test_the_tokenizer_bundle_is_the_exported_directory(engine: Engine, model_files: tuple[Path, Path]) -> None:
    data, digest = bytearray(), ""
    for chunk in engine.stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=60):
        data.extend(chunk.data)
        digest = chunk.sha256 or digest
    assert hashlib.sha256(data).hexdigest() == digest
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        names = set(archive.namelist())
        assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= names
        assert archive.read("tokenizer.json") == (model_files[1] / "tokenizer.json").read_bytes()


@pytest.fixture(scope="module")
def autoloading_gateway(llamacpp: Spawned) -> Iterator[Spawned]:
    """A gateway given no tokenizer: it takes the engine's bundle."""
    proc = spawn_gateway([llamacpp.url], extra=["--backend", "sglang"], timeout=60)
    try:
        yield proc
    finally:
        proc.stop()


def test_a_gateway_without_model_path_takes_the_engine_s_tokenizer(autoloading_gateway: Spawned) -> None:
    with httpx.Client(base_url=autoloading_gateway.url, timeout=60) as client:
        deadline = time.monotonic() + 60  # a guard against a hang, not a measurement
        while client.get("/readiness").status_code != 200:
            assert time.monotonic() < deadline, "the gateway never loaded the engine's tokenizer"
            time.sleep(0.1)
        body = client.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 32, "temperature": 0, "messages": [{"role": "user", "content": HELLO}]},
        ).json()
    assert body["stop_reason"] == "end_turn" and body["content"][0]["text"].strip(), body
