"""docs/reference/options.md, made from the option fields' metadata and the algorithm registry.

    python -m qlinear.quantize._options_reference > docs/reference/options.md

tests/test_quantize_config.py checks that the page is what this prints, so a flag, a
default or a help text changed in code changes the page with it.
"""

from __future__ import annotations

from qlinear.quantize._option_fields import GROUPS, default_of, flag_of, help_of, option_fields
from qlinear.quantize._options import QuantizeOptions
from qlinear.quantize.algorithms import ALGORITHMS

__all__ = ["markdown"]

_STAGE_WORDS = {
    "float": "rewrites the float model before calibration",
    "calibration": "calibrates what it needs; applied as each weight is rounded",
    "refine": "improves the quantized model after the accuracy target",
}


def markdown() -> str:
    """The options reference page, as Markdown."""
    lines = [
        "# Options of `qlinear quantize`",
        "",
        "Every option is a flag of `qlinear quantize` and a keyword of `qlinear.quantize.quantize_model` (or a field of",
        "`QuantizeOptions`) of the same meaning. This page is generated from the fields' metadata",
        "(`python -m qlinear.quantize._options_reference > docs/reference/options.md`); the data, output and execution",
        "flags (`--calibration`, `--eval`, `--workers`, `--report`, ...) are in [cli.md](cli.md).",
    ]
    fields = option_fields(QuantizeOptions)
    for group in GROUPS:
        rows = [(f, o) for f, o in fields if o.group == group]
        if not rows:
            continue
        lines += [
            "",
            f"## {group[0].upper()}{group[1:]}",
            "",
            "| flag | keyword | default | what it does |",
            "| --- | --- | --- | --- |",
        ]
        for f, o in rows:
            flag = flag_of(f, o)
            if o.form == "either":
                flag += f" / --no-{flag[2:]}"
            elif o.form == "value":
                flag += f" {o.metavar or f.name.upper()}"
            elif o.form == "list":
                flag += f" {o.metavar or f.name.upper()} ..."
            default = default_of(f)
            word = o.none_word if default is None and o.none_word else default
            shown = "decided from the model and data" if o.form == "either" else "none" if word in (None, ()) else f"`{word}`"
            lines.append(f"| `{flag}` | `{f.name}` | {shown} | {help_of(f, o).replace('|', '/')} |")
    lines += [
        "",
        "## Algorithms, in the order they run",
        "",
        "| algorithm | when it runs | what it does |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{a.name}` | {_STAGE_WORDS[a.stage]} | {a.summary} |" for a in ALGORITHMS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
