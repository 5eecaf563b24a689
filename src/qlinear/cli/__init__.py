"""The ``qlinear`` command: one subcommand a module, registered here."""

from __future__ import annotations

import importlib
import signal
import sys
import threading

from qlinear import __version__
from qlinear.cli._args import Parser

__all__ = ["command", "main"]

# Subcommand name -> module defining ``add_arguments(parser)`` and ``run(args) -> int``.
SUBCOMMANDS = {
    "quantize": "qlinear.cli._quantize",
    "report": "qlinear.cli._report",
    "bench": "qlinear.cli._bench",
    "conformance": "qlinear.cli._conformance",
    "inspect": "qlinear.cli._inspect",
    "warmup": "qlinear.cli._warmup",
}


def main(argv: list[str] | None = None) -> int:
    """Run the ``qlinear`` command line; returns the exit status."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before a subcommand runs: while its modules import
        sys.stderr.write("qlinear: interrupted\n")
        return 128 + signal.SIGINT


def command() -> None:
    """The ``qlinear`` console script: :func:`main`'s status as the process's.

    Ctrl-C once the run has ended (while the interpreter shuts down) is
    ignored: the output is written, and the status says how the run ended.
    """
    status = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)


def _main(argv: list[str] | None) -> int:
    parser = Parser(prog="qlinear", description="ONNX linear quantization, exact to the specification.")
    parser.add_argument("--version", action="version", version=f"qlinear {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules, parsers = {}, {}
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        parsers[name] = commands.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__)
        module.add_arguments(parsers[name])
        modules[name] = module
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand's parser, so the error names it ("qlinear quantize: error: ...")
        parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    # Ctrl-C and SIGTERM: one line, no traceback; a quantizer run leaves no file behind (it writes beside the output,
    # then renames) and its worker processes end with it.
    previous = signal.signal(signal.SIGTERM, _terminated) if threading.current_thread() is threading.main_thread() else None
    try:
        return modules[args.command].run(args)
    except _Terminated:
        sys.stderr.write(f"qlinear {args.command}: terminated\n")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        sys.stderr.write(f"qlinear {args.command}: interrupted\n")
        return 128 + signal.SIGINT
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, so that it unwinds as Ctrl-C does."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


if __name__ == "__main__":
    command()
