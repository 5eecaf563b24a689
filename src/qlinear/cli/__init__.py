"""The ``qlinear`` command: one subcommand a module, registered here."""

from __future__ import annotations

import importlib
import sys

from qlinear import __version__
from qlinear.cli._args import Parser

__all__ = ["main"]

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
    parser = Parser(prog="qlinear", description="ONNX linear quantization, exact to the specification.")
    parser.add_argument("--version", action="version", version=f"qlinear {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__)
        module.add_arguments(sub)
        modules[name] = module
    args = parser.parse_args(argv)
    return modules[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
