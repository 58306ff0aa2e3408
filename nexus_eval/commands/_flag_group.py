"""A group of flags declared once, as a dataclass, and taken by a verb as one argument.

Typer reads a command's options from its function's parameters, one parameter each. Flags that several verbs
share (``submit`` and ``run``'s job flags) or that a verb hands on together (``probe run``'s settings) are
declared once instead: a frozen dataclass whose fields each carry their typer option (:func:`flag`: the field's
default is the option's). A verb names the group as one parameter annotated with the dataclass, and
:func:`takes_flags` makes the command typer sees: the group's fields stand where that parameter stood, as
options in field order (so ``--help`` lists them there), and the verb is called with them as one instance.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from typer.models import OptionInfo

_OPTION = "typer_option"


def flag(option: OptionInfo) -> Any:
    """A dataclass field that is the typer option ``option`` (declared as ``typer.Option(default, ...)``)."""
    return dataclasses.field(default=option.default, metadata={_OPTION: option})


def _groups(signature: inspect.Signature) -> dict[str, type]:
    """The verb's parameters annotated with a flag group, by name."""
    return {
        p.name: p.annotation
        for p in signature.parameters.values()
        if isinstance(p.annotation, type) and dataclasses.is_dataclass(p.annotation)
    }


def _options(group: type, kind: Any) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group)
    return [
        inspect.Parameter(f.name, kind, default=f.metadata[_OPTION], annotation=hints[f.name])
        for f in dataclasses.fields(group)
    ]


def takes_flags(verb: Callable[..., Any]) -> Callable[..., Any]:
    """``verb`` with each parameter annotated with a flag group (a dataclass of :func:`flag` fields) spread
    into that group's options for typer, and given back to ``verb`` as one instance of the group."""
    signature = inspect.signature(verb, eval_str=True)
    groups = _groups(signature)
    if not groups:
        raise TypeError(f"{verb.__name__} takes no flag group (a parameter annotated with a dataclass of flags)")
    params: list[inspect.Parameter] = []
    for p in signature.parameters.values():
        params += _options(groups[p.name], p.kind) if p.name in groups else [p]
    names = [p.name for p in params]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise TypeError(f"{verb.__name__}: {clash} named twice (a flag group's field and another parameter)")

    @functools.wraps(verb)
    def command(**given: Any) -> Any:
        for name, group in groups.items():
            given[name] = group(**{f.name: given.pop(f.name) for f in dataclasses.fields(group)})
        return verb(**given)

    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command
