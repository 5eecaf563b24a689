"""The examples in docstrings and in README.md run and say what they show."""

from __future__ import annotations

import doctest
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCTESTED = [
    "qlinear",
    "qlinear.dtypes._table",
    "qlinear.dtypes._packing",
    "qlinear.dtypes._tensor_proto",
    "qlinear.dtypes._rounding",
    "qlinear.ops._quantize_linear",
    "qlinear.ops._dequantize_linear",
    "qlinear.ops._dynamic_quantize_linear",
]


@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"np": importlib.import_module("numpy")}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_readme_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples write their models to the working directory
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:  # the README reads top to bottom: later blocks use earlier names
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["w4"].dtype.name == "int4" and namespace["packed"].size == namespace["w4"].size // 2


@pytest.mark.parametrize("page", ["operators.md", "onnx.md"])
def test_docs_examples_run(tmp_path, monkeypatch, page):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)
    assert blocks
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, page, "exec"), namespace)


def test_readme_commands_match_ci():
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && python -m pytest" in text
    assert "pip install -e '.[test]' && python -m pytest" in ci
    # The first command sets up with the core dependencies only and runs the main job.
    assert "pip install -e . && qlinear quantize --demo" in text.split("```")[1]


def test_semantics_doc_names_only_existing_tests():
    text = (ROOT / "docs" / "semantics.md").read_text()
    tests = (ROOT / "tests" / "test_semantics.py").read_text()
    named = re.findall(r"[(,] ?`(test_[a-z0-9_]+)`", text)
    assert len(named) >= 15
    for name in named:
        assert f"def {name}(" in tests, name
