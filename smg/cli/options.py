"""Command-line flags declared once, on the settings they fill.

Settings are frozen dataclasses whose fields carry their flag in `metadata`
(`smg.flags.option("--retry-max-retries", "…")`): the gateway's own (`GatewayConfig`), the
launching process's and each component's alike. `with_component_flags` adds those fields to a
typer command's signature as options (so `--help` lists them with their defaults, aliases and
environment variables); `build_component` reads the parsed values back into the dataclass. A
boolean field declared with `invert=True` is a `--disable-…` switch that sets it False; a field
whose flag takes something else than the field holds (`takes`) is filled by its `parse`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str, "bool": bool, "Path": Path}


def param_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def flagged(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    """The fields of settings class `cls` that `smg launch` exposes as flags."""
    return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]


def _takes(f: dataclasses.Field[Any]) -> str:
    """What the flag takes: the field's type unless declared otherwise (`option(takes=…)`)."""
    return f.metadata.get("takes") or str(f.type)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _parameter(f: dataclasses.Field[Any]) -> inspect.Parameter:
    meta = f.metadata
    kind = _takes(f)
    default = None if meta.get("takes") else _default(f)
    help_text = meta["help"]
    if meta["choices"]:
        help_text += f" One of: {', '.join(meta['choices'])}."
    if kind == "bool":
        annotation: Any = bool
        default = False  # a switch: given means the opposite of the field's default
    elif kind.startswith(("tuple[", "list[")):
        annotation, default = list[str], None if default is None else list(default)
    else:
        annotation = _TYPES[kind.split(" | ")[0]]
    names = (meta["flag"], *meta.get("aliases", ()))
    return inspect.Parameter(
        param_name(meta["flag"]),
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[
            annotation, typer.Option(*names, help=help_text, show_default=kind != "bool", envvar=meta.get("envvar"))
        ],
    )


def with_component_flags(*classes: type[Any]) -> Callable[[F], F]:
    """Decorate a command taking `**flags`: every flagged field of `classes` becomes an option."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        kept = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        added = [_parameter(f) for cls in classes for f in flagged(cls)]
        func.__signature__ = signature.replace(parameters=kept + added)  # type: ignore[attr-defined]
        return func

    return decorate


def build_component(cls: type[T], params: Mapping[str, Any], **overrides: Any) -> T:
    """`cls` filled from the parsed flags (a flag not given keeps the field's default)."""
    values: dict[str, Any] = {}
    for f in flagged(cls):
        name = param_name(f.metadata["flag"])
        if name not in params or params[name] is None:
            continue
        value = params[name]
        parse = f.metadata.get("parse")
        if parse is not None:
            value = parse(value)
        elif f.metadata["invert"]:
            value = not value
        elif str(f.type).startswith("tuple["):
            value = tuple(value)
        choices = f.metadata["choices"]
        if choices and value not in choices:
            raise ValueError(f"{f.metadata['flag']} must be one of {', '.join(choices)}, got {value!r}")
        values[f.name] = value
    values.update(overrides)
    return cls(**values)
