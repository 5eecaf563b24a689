"""One configuration: option fields whose metadata makes the flags, the settings and the report's command; defaults
resolved by one pure function from facts; algorithms found through their registry."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import pytest

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.cli import _quantize as cli_quantize
from qlinear.quantize._option_fields import Option, command_words, option, option_fields, values_from_args
from qlinear.quantize._options import given, resolve
from qlinear.quantize._options_reference import markdown
from qlinear.quantize.algorithms import ALGORITHMS, STAGES, Algorithm, Facts, at_stage, register

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = Facts(calibration_given=True, has_inputs=True, arrays=True)
STREAM = Facts(calibration_given=True, has_inputs=True, arrays=False)
STATS = Facts(calibration_given=False, has_inputs=False, arrays=True)  # saved statistics and eval arrays
W4 = {"weights": "int4", "granularity": "blocked"}

# (options asked for, facts) -> the algorithms resolve() turns on.
RESOLVED = [
    ({}, DATA, {"bias_correction": True, "gptq": False, "smoothquant": True, "awq": False}),
    ({}, STREAM, {"bias_correction": True, "gptq": False, "smoothquant": False, "awq": False}),
    ({}, STATS, {"bias_correction": False, "gptq": False, "smoothquant": False, "awq": False}),
    ({"activations": "uint16"}, DATA, {"bias_correction": True, "gptq": False, "smoothquant": False, "awq": False}),
    ({**W4}, DATA, {"bias_correction": True, "gptq": True, "smoothquant": True, "awq": False}),
    ({**W4, "activations": None}, DATA, {"bias_correction": True, "gptq": True, "smoothquant": False, "awq": True}),
    ({**W4, "activations": None}, STREAM, {"bias_correction": True, "gptq": True, "smoothquant": False, "awq": False}),
    ({"weights": "int4", "granularity": "per-tensor"}, DATA, {"gptq": False}),
    ({"weights": "float4e2m1", "granularity": "blocked", "activations": None}, DATA, {"gptq": False, "awq": False}),
    ({"bias_correction": False, "smoothquant": False}, DATA, {"bias_correction": False, "smoothquant": False}),
]


@pytest.mark.parametrize(("asked", "facts", "want"), RESOLVED)
def test_defaults_are_resolved_from_the_options_and_facts(asked, facts, want):
    resolved = resolve(qq.QuantizeOptions(**asked), facts)
    assert {name: getattr(resolved, name) for name in want} == want


# (options asked for, facts) -> the error resolve() raises for an algorithm that is on but cannot run.
REFUSED = [
    ({"awq": True}, DATA, "awq scales weight-only layers"),
    ({**W4, "activations": None, "awq": True}, STREAM, "awq reads the calibration data twice"),
    ({"activations": None, "smoothquant": True}, DATA, "smoothquant moves activation outliers"),
    ({"smoothquant": True}, STATS, "smoothquant needs calibration data"),
    ({"smoothquant": True}, STREAM, "smoothquant reads the calibration data twice"),
    ({"finetune": 10}, Facts(calibration_given=False, has_inputs=False, arrays=False), "finetune trains on the calibration"),
]


@pytest.mark.parametrize(("asked", "facts", "message"), REFUSED)
def test_an_algorithm_that_cannot_run_is_refused_before_any_work(asked, facts, message):
    with pytest.raises(QuantizationError, match=message):
        resolve(qq.QuantizeOptions(**asked), facts)


def test_a_fixed_batch_overrides_the_batch_size():
    assert resolve(qq.QuantizeOptions(batch_size=16), DATA, batch_size=1).batch_size == 1
    assert resolve(qq.QuantizeOptions(batch_size=16), DATA).batch_size == 16


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_quantize.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_command_lines_defaults_are_the_options_defaults():
    # The flags are made from the fields: a command line with no option flags gives QuantizeOptions().
    assert qq.QuantizeOptions(**values_from_args(_parsed(["m.onnx"]), qq.QuantizeOptions)) == qq.QuantizeOptions()


SETTINGS = [
    {},
    {"weights": "int4", "granularity": "blocked", "block_size": 64, "activations": None, "gptq": False},
    {"method": "percentile", "percentile": 99.9, "symmetric": True, "exclude": ("conv1", "Gemm"), "opset": 21},
    {"target_sqnr_db": 35.0, "max_float": 0.0, "finetune": 20, "finetune_weights": False, "equalize": True},
    {"promote": False, "smoothquant": False, "bias_correction": True, "weight_clip": "mse", "batch_size": 4},
]


@pytest.mark.parametrize("values", SETTINGS)
def test_the_reports_command_repeats_the_run(values):
    # Every setting reaches the command (the percentile had not), and parsing it gives the same options back.
    options = qq.QuantizeOptions(**values)
    words = command_words(options.to_dict(), qq.QuantizeOptions)
    again = qq.QuantizeOptions(**values_from_args(_parsed(["m.onnx", *words]), qq.QuantizeOptions))
    assert again == options


def test_settings_are_every_field_once():
    options = qq.QuantizeOptions()
    assert list(options.to_dict()) == [f.name for f in dataclasses.fields(options)]
    flags = [o.flag or f.name for f, o in option_fields(qq.QuantizeOptions)]
    assert len(flags) == len(set(flags)) == len(dataclasses.fields(options))


def test_keywords_are_set_over_given_options_and_unknown_ones_named():
    base = qq.QuantizeOptions(weights="int4", granularity="blocked")
    assert given(base, {"method": "minmax"}) == dataclasses.replace(base, method="minmax")
    assert given(None, {"method": "minmax"}) == qq.QuantizeOptions(method="minmax")
    with pytest.raises(QuantizationError, match="unknown options wieghts"):
        given(base, {"wieghts": "int8"})
    with pytest.raises(QuantizationError, match="options must be a QuantizeOptions, got dict"):
        given({"weights": "int8"}, {})


def test_every_algorithm_is_registered_with_its_options_and_flags():
    names = [a.name for a in ALGORITHMS]
    # The order they run in.
    assert names == [
        "equalize", "equalize_depthwise", "awq", "smoothquant", "bias_correction", "gptq", "empirical_bias_correction",
        "finetune",
    ]  # fmt: skip
    fields = {f.name for f in dataclasses.fields(qq.QuantizeOptions)}
    help_text = _help()
    for a in ALGORITHMS:
        assert a.stage in STAGES and {name for name, _, _ in a.fields} <= fields
        for name, _, f in a.fields:
            assert (f.metadata["option"].flag or "--" + name.replace("_", "-")) in help_text
        assert (a.apply is not None) == (a.stage != "calibration") and (a.calibrates is not None) == (a.stage == "calibration")
    on = resolve(qq.QuantizeOptions(equalize=True, finetune=3, empirical_bias_correction=True), DATA)
    assert [a.name for a in at_stage("float", on)] == ["equalize", "equalize_depthwise", "smoothquant"]
    assert [a.name for a in at_stage("refine", on)] == ["empirical_bias_correction", "finetune"]


def _help() -> str:
    parser = argparse.ArgumentParser()
    cli_quantize.add_arguments(parser)
    return parser.format_help()


def test_the_registry_refuses_a_second_algorithm_of_a_name_and_a_bad_stage():
    fields = (("gptq", bool, option(False, form="switch", help="again")),)
    with pytest.raises(ValueError, match="'gptq' is registered already"):
        register(Algorithm(name="gptq", summary="again", stage="calibration", fields=fields, calibrates=lambda fm, n, o: []))
    with pytest.raises(ValueError, match="stage must be one of float, calibration, refine"):
        Algorithm(name="x", summary="", stage="later", fields=(("x", bool, option(False, form="switch", help="")),))
    with pytest.raises(ValueError, match="first field must be named 'x'"):
        Algorithm(name="x", summary="", stage="float", fields=(("y", bool, option(False, form="switch", help="")),))
    with pytest.raises(ValueError, match=r"Option\.form must be one of"):
        Option(help="", form="flag")


def test_the_options_reference_is_generated_from_the_fields():
    page = (ROOT / "docs" / "reference" / "options.md").read_text()
    assert page == markdown(), "run: python -m qlinear.quantize._options_reference > docs/reference/options.md"
    assert all(f"`{f.name}`" in page for f, _ in option_fields(qq.QuantizeOptions))
