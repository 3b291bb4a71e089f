"""A group of commands whose parameters are declared once, without importing a CLI framework.

A command is a function whose parameters are `Annotated[T, Option(...)]` or
`Annotated[T, Argument(...)]`, taking exactly what `typer.Option` / `typer.Argument` take.
`Commands.typer()` builds the typer app from them (help, `smg --help`, every error message
as typer words it); `smg.cli.quick` runs the common command line straight from the same
declarations, because importing typer brings in pydantic and typer builds a pydantic adapter
for every parameter of the command it runs: most of a journal command's start-up.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, get_args, get_origin

F = TypeVar("F", bound=Callable[..., Any])


class Option:
    """An option: its flags (`"--limit", "-n"`) and the keywords `typer.Option` takes."""

    __slots__ = ("decls", "settings")

    def __init__(self, *decls: str, **settings: Any) -> None:
        self.decls = decls
        self.settings = settings


class Argument:
    """A positional argument: the keywords `typer.Argument` takes."""

    __slots__ = ("settings",)

    def __init__(self, **settings: Any) -> None:
        self.settings = settings


def declared(annotation: Any) -> tuple[Any, Option | Argument | None]:
    """The value type of a parameter's annotation and its declaration, if it has one."""
    if get_origin(annotation) is Annotated:
        base, *extras = get_args(annotation)
        for extra in extras:
            if isinstance(extra, Option | Argument):
                return base, extra
        return base, None
    return annotation, None


class Commands:
    """Commands by name, in the order declared, and the typer group's own settings."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.functions: dict[str, Callable[..., Any]] = {}
        self._typer: Any = None

    def command(self, name: str) -> Callable[[F], F]:
        def register(function: F) -> F:
            self.functions[name] = function
            return function

        return register

    def typer(self) -> Any:
        """The typer app of these commands (built once)."""
        if self._typer is None:
            import typer

            app = typer.Typer(**self.settings)
            for name, function in self.functions.items():
                app.command(name)(_for_typer(function, typer))
            self._typer = app
        return self._typer


def _for_typer(function: Callable[..., Any], typer: Any) -> Callable[..., Any]:
    signature = inspect.signature(function, eval_str=True)
    parameters = []
    for parameter in signature.parameters.values():
        base, declaration = declared(parameter.annotation)
        if isinstance(declaration, Option):
            parameter = parameter.replace(
                annotation=Annotated[base, typer.Option(*declaration.decls, **declaration.settings)]
            )
        elif isinstance(declaration, Argument):
            parameter = parameter.replace(annotation=Annotated[base, typer.Argument(**declaration.settings)])
        parameters.append(parameter)

    @functools.wraps(function)
    def command(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command
