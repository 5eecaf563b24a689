"""How a quantizer option reads on the command line, in the report's command and in the options reference.

Each field of :class:`qlinear.quantize.QuantizeOptions` carries an
:class:`Option` in its metadata. The ``qlinear quantize`` flags, the
report's settings, the command line that repeats a run and
docs/reference/options.md are all made from it, so a flag, its help and
its default are written once, beside the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from os import PathLike
from typing import Any

__all__ = [
    "FORMS", "GROUPS", "Option", "add_arguments", "command_words", "data_words", "in_flags", "option", "option_fields",
    "values_from_args",
]  # fmt: skip

# The command line's argument groups, in the order --help shows them.
GROUPS = ("data", "types", "algorithms", "accuracy target", "target runtime")
# How an option is given on the command line:
#   value:   --flag VALUE
#   list:    --flag A B ... (repeatable, extends)
#   switch:  --flag sets True
#   negated: --flag sets False (the option is True unless it is given)
#   either:  --flag / --no-flag; None (decided from the model and data) unless one is given
FORMS = ("value", "list", "switch", "negated", "either")


@dataclass(frozen=True)
class Option:
    """The command-line form of one option field.

    ``help`` may name ``{choices}`` and ``{default}``; they are filled in
    from ``choices`` and the field's default.
    """

    help: str
    group: str = "types"
    form: str = "value"
    flag: str | None = None  # default: "--" and the field's name with dashes
    metavar: str | None = None
    type: Any = str  # what argparse converts a value with
    choices: tuple[str, ...] | None = None
    none_word: str | None = None  # the word the command line takes for None (weight-only activations: "none")
    shown: bool = False  # in the report's command even at its default (the types a run used)

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"Option.form must be one of {', '.join(FORMS)}, got {self.form!r}")
        if self.group not in GROUPS:
            raise ValueError(f"Option.group must be one of {', '.join(GROUPS)}, got {self.group!r}")


def option(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, **meta: Any) -> Any:
    """A dataclass field with its :class:`Option` metadata."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"option": Option(**meta)})


def option_fields(cls: type) -> list[tuple[dataclasses.Field, Option]]:
    """The fields of ``cls`` that have a command-line form, in declaration order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata]


def flag_of(f: dataclasses.Field, o: Option) -> str:
    return o.flag or _flag(f.name)


def _flag(name: str) -> str:
    """The flag of a Python name: ``calibrate_random`` is ``--calibrate-random``."""
    return "--" + name.replace("_", "-")


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def help_of(f: dataclasses.Field, o: Option) -> str:
    default = default_of(f)
    word = o.none_word if default is None and o.none_word else default
    return o.help.format(choices=", ".join(o.choices or ()), default=word)


def add_arguments(groups: dict[str, Any], cls: type) -> None:
    """Add one argument per option field of ``cls`` to the argparse group its metadata names."""
    for f, o in option_fields(cls):
        flag, default = flag_of(f, o), default_of(f)
        kw: dict[str, Any] = {"dest": f.name, "help": help_of(f, o).replace("%", "%%")}
        if o.form == "value":
            metavar = o.metavar or f.name.upper()
            kw.update(type=o.type, metavar=metavar, default=o.none_word if default is None and o.none_word else default)
        elif o.form == "list":
            kw.update(nargs="+", action="extend", default=[], metavar=o.metavar or f.name.upper())
        elif o.form == "switch":
            kw.update(action="store_true")
        elif o.form == "negated":
            kw.update(action="store_false")
        else:
            kw.update(action=argparse.BooleanOptionalAction, default=None)
        groups[o.group].add_argument(flag, **kw)


def values_from_args(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The option values the parsed command line gives, as keywords of ``cls``."""
    out = {}
    for f, o in option_fields(cls):
        value = getattr(args, f.name)
        if o.none_word is not None and value == o.none_word:
            value = None
        out[f.name] = tuple(value) if o.form == "list" else value
    return out


def command_words(settings: dict[str, Any], cls: type) -> list[str]:
    """The flags that repeat a run whose settings (``to_dict()``) are ``settings``: each one not at its default."""
    words: list[str] = []
    for f, o in option_fields(cls):
        if f.name not in settings:
            continue
        value, default, flag = settings[f.name], default_of(f), flag_of(f, o)
        if isinstance(default, tuple):
            default = list(default)
        if value == default and not o.shown:
            continue
        if o.form == "list":
            words += [flag, *map(str, value)]
        elif o.form in ("switch", "negated"):
            words += [flag] if value != default else []
        elif o.form == "either":
            words += [] if value is None else [flag if value else "--no-" + flag[2:]]
        elif value is None:
            words += [flag, o.none_word] if o.none_word else []
        else:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return words


def data_words(calibration: Any, eval_data: Any, labels: str | None, calibrate_random: int | None, stats: Any) -> list[str]:
    """The data flags of a run: files by their paths; data given as arrays or batches in Python, as a placeholder."""

    def given(data: Any, placeholder: str) -> str:
        return str(data) if isinstance(data, (str, PathLike)) else placeholder

    words: list[str] = []
    if calibrate_random is not None:
        words += ["--calibrate-random", str(calibrate_random)]
    elif calibration is not None:
        words += ["--calibration", given(calibration, "CALIBRATION.npz")]
    if eval_data is not None:
        words += ["--eval", given(eval_data, "EVAL.npz")]
    if labels is not None:
        words += ["--labels", labels]
    if stats is not None:
        words += ["--stats", str(stats)]
    return words


def in_flags(message: str, cls: type, others: tuple[str, ...] = ()) -> str:
    """``message`` (a QuantizationError's, of the Python API) with the options it names written as their flags.

    An option's name is replaced where it holds an underscore (no prose
    word does) or where it opens the message (``"weights must be one of
    ..."``); ``others`` names arguments that are not options
    (``calibrate_random``), whose flags are their names in the same form.
    """
    fields = {f.name: (f, o) for f, o in option_fields(cls)}
    flags = {name: flag_of(f, o) for name, (f, o) in fields.items()} | {name: _flag(name) for name in others}

    def keyword(m: re.Match) -> str:
        """``promote=False`` as the flag that gives it (``--no-promote``); ``metric=`` as ``--metric``."""
        name, value = m.group(1), m.group(2)
        if name not in flags:
            return m.group(0)
        if not value or name not in fields or fields[name][1].form == "value":
            return flags[name]
        f, o = fields[name]
        if o.form in ("switch", "negated"):  # the flag gives the value its default is not; the default is no flag
            return flags[name] if str(default_of(f)) != value else m.group(0)
        return _flag(name) if value == "True" else "--no-" + name.replace("_", "-")

    message = re.sub(r"\b([a-z][a-z0-9_]*)=(?:(True|False)\b|(?=[\s,;)]|$))", keyword, message)
    first, _, rest = message.partition(" ")
    if first in flags:
        message = f"{flags[first]} {rest}"
    return re.sub(r"\b[a-z]+(?:_[a-z0-9]+)+\b", lambda m: flags.get(m.group(0), m.group(0)), message)
