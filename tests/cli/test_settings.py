"""Every `smg launch` setting is declared once, on the settings field it fills: one flag, one
option, one field, and the option's default is the field's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import typer

from smg.cli.main import _SETTINGS, app, router_config
from smg.cli.options import build_component, flagged, param_name
from smg.config import GatewayConfig, ProcessConfig
from smg.routing.policies import PolicyConfig


def _launch() -> Any:
    """The click command typer builds for `smg launch`."""
    return typer.main.get_command(app).commands["launch"]  # type: ignore[attr-defined]


def _parsed(args: list[str]) -> dict[str, Any]:
    """The parameters `smg launch ARGS` is called with (the command itself is not run)."""
    with _launch().make_context("launch", list(args)) as ctx:
        return dict(ctx.params)


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SMG_API_KEY", "SMG_JOURNAL"):
        monkeypatch.delenv(name, raising=False)


def _declared() -> list[tuple[type[Any], dataclasses.Field[Any]]]:
    return [(cls, f) for cls in _SETTINGS for f in flagged(cls)]


def test_every_flag_is_one_option_filling_one_field() -> None:
    options = {p.name: p for p in _launch().params if p.param_type_name == "option" and p.name != "help"}
    declared = _declared()
    names = [param_name(f.metadata["flag"]) for _, f in declared]
    assert len(names) == len(set(names)), "two settings declare the same flag"
    assert sorted(names) == sorted(options), "an option without a settings field, or a field without an option"
    spelled = [flag for _, f in declared for flag in (f.metadata["flag"], *f.metadata["aliases"])]
    assert len(spelled) == len(set(spelled)), "one flag name (or alias) declared twice"
    for _, f in declared:
        option = options[param_name(f.metadata["flag"])]
        assert option.opts == [f.metadata["flag"], *f.metadata["aliases"]]
        assert option.envvar == f.metadata["envvar"]


def test_defaults_of_the_options_are_the_fields_defaults() -> None:
    params = _parsed([])
    gateway = build_component(GatewayConfig, params)
    assert dataclasses.replace(gateway, instance_id="x") == GatewayConfig(instance_id="x")
    for cls in _SETTINGS[1:]:
        assert build_component(cls, params) == cls(), cls.__name__


def test_aliases_switches_and_parsed_flags_reach_their_fields() -> None:
    params = _parsed(
        [
            "--runtime", "sglang",
            "--model", "m",
            "--prefill", "grpc://p:1 9000",
            "--prefill", "grpc://q:1",
            "--model-alias", "a=b",
            "--journal-retention", "7d",
            "--log-level", "DEBUG",
            "--disable-tokenizer-autoload",
            "--no-journal",
            "--workers", "3",
        ]
    )  # fmt: skip
    config = build_component(GatewayConfig, params)
    assert (config.backend, config.model_path) == ("sglang", "m")
    assert config.prefill_urls == (("grpc://p:1", 9000), ("grpc://q:1", None))
    assert config.model_aliases == {"a": "b"}
    assert config.journal_retention == (7 * 86400.0, None)
    assert config.log_level == "debug"
    assert config.tokenizer_autoload is False
    assert build_component(ProcessConfig, params) == ProcessConfig(workers=3, no_journal=True)


def test_the_policy_knobs_reach_the_routers_policies() -> None:
    params = _parsed(
        [
            "--cache-threshold", "0.5",
            "--spill-abs-threshold", "8",
            "--balance-rel-threshold", "2",
            "--eviction-interval", "30",
            "--max-tree-size", "1000",
            "--prefix-token-count", "64",
            "--prefix-hash-load-factor", "1.5",
            "--prefix-hash-balance-abs-threshold", "3",
            "--sticky-key-idle-secs", "60",
            "--assignment-mode", "min_load",
            "--routing-key-headers", "x-team",
            "--routing-key-headers", "x-user",
        ]
    )  # fmt: skip
    assert router_config(params).policies == PolicyConfig(
        cache_threshold=0.5,
        balance_abs_threshold=8,
        balance_rel_threshold=2.0,
        eviction_interval_secs=30.0,
        max_tree_size=1000,
        prefix_token_count=64,
        prefix_hash_load_factor=1.5,
        prefix_hash_balance_abs_threshold=3,
        max_idle_secs=60.0,
        assignment_mode="min_load",
        routing_key_headers=("x-team", "x-user"),
    )
    with pytest.raises(ValueError, match="--cache-threshold must be between 0.0 and 1.0"):
        router_config(_parsed(["--cache-threshold", "1.5"]))


def test_environment_variables_fill_their_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_API_KEY", "k")
    monkeypatch.setenv("SMG_JOURNAL", "elsewhere.db")
    config = build_component(GatewayConfig, _parsed([]))
    assert (config.api_key, config.journal_path) == ("k", Path("elsewhere.db"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-alias", "nope"], "--model-alias takes ALIAS=CANONICAL"),
        (["--encode", "grpc://e:1 x"], "--encode takes URL [BOOTSTRAP_PORT]"),
        (["--journal-retention", "forever"], "--journal-retention:"),
    ],
)
def test_a_flag_that_cannot_be_parsed_is_refused_by_name(args: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build_component(GatewayConfig, _parsed(args))
