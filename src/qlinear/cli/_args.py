"""What every subcommand's arguments share: one-line errors, checked numbers, names without spaces."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable

__all__ = ["Parser", "add_json", "cpu_count", "int_in", "json_on_stdout", "name_in", "write_json"]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2 (never a usage block or a traceback)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_in(low: int, high: int | Callable[[], int] | None = None, *, what: str = "a number") -> Callable[[str], int]:
    """An argparse type: an int in [low, high] (``high`` may be a function, read when parsing)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} (an integer), got {text!r}") from None
        top = high() if callable(high) else high
        if value < low or (top is not None and value > top):
            span = f"of at least {low}" if top is None else f"from {low} to {top}"
            raise argparse.ArgumentTypeError(f"expected {what} {span}, got {value}")
        return value

    return parse


def name_in(names: Iterable[str]) -> Callable[[str], str]:
    """An argparse type: one of ``names``, written with hyphens for spaces (``per-axis-0``) or as before."""
    by_key = {n.replace(" ", "-"): n for n in names}

    def parse(text: str) -> str:
        key = text.strip().replace(" ", "-")
        if key not in by_key:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(by_key)}, got {text!r}")
        return by_key[key]

    return parse


def cpu_count() -> int:
    """Threads numba may run (NUMBA_NUM_THREADS, at most the machine's cores)."""
    try:
        import numba

        return int(numba.config.NUMBA_NUM_THREADS)
    except ImportError:  # pragma: no cover - numba is a core dependency
        import os

        return os.cpu_count() or 1


def add_json(parser: argparse.ArgumentParser, what: str, *, path_after_json: bool = False) -> None:
    """``--json`` (print ``what`` as JSON on stdout, the tables to stderr) and ``--json-file PATH`` (write it there).

    ``path_after_json``: also take ``--json PATH`` (the older spelling, as a
    file), for subcommands without positional arguments it could swallow.
    """
    if path_after_json:
        parser.add_argument(
            "--json", nargs="?", const="-", metavar="PATH",
            help=f"print {what} as JSON on stdout (tables go to stderr); --json PATH writes it to PATH instead",
        )  # fmt: skip
    else:
        parser.add_argument(
            "--json", action="store_const", const="-", help=f"print {what} as JSON on stdout instead of the tables"
        )
    parser.add_argument("--json-file", metavar="PATH", help=f"also write {what} as JSON to PATH")


def json_on_stdout(args: argparse.Namespace) -> bool:
    """Whether the JSON goes to stdout (so everything else goes to stderr)."""
    return getattr(args, "json", None) == "-"


def write_json(text: str, args: argparse.Namespace) -> None:
    """``text`` (JSON) to stdout and the files ``--json`` / ``--json-file`` name."""
    if args.json == "-":
        sys.stdout.write(text + "\n")
    for path in {p for p in (args.json, getattr(args, "json_file", None)) if p and p != "-"}:
        with open(path, "w") as f:
            f.write(text + "\n")
