"""The examples in docstrings, README.md and docs/ run and say what they show, and the docs' links and names resolve."""

from __future__ import annotations

import doctest
import importlib
import pathlib
import re
from importlib import resources

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DOCTESTED = [
    "qlinear",
    "qlinear.dtypes._table",
    "qlinear.dtypes._packing",
    "qlinear.dtypes._tensor_proto",
    "qlinear.dtypes._rounding",
    "qlinear.ops._quantize_linear",
    "qlinear.ops._dequantize_linear",
    "qlinear.ops._dynamic_quantize_linear",
    "qlinear.spec._versions",
]
# docs/notes/ holds dated measurement logs: their commands and figures are a record of a run, not examples to run
# or names that must still resolve. Every other page is a guide, a reference or an explanation.
NOTES = DOCS / "notes"
PAGES = sorted(p for p in DOCS.rglob("*.md") if NOTES not in p.parents)
ALL_MARKDOWN = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
# docs/reference/options.md is generated from the option fields' metadata by a later step
# (python -m qlinear.quantize._options_reference): a link to it stands whether or not it is there yet.
GENERATED = {DOCS / "reference" / "options.md"}

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _python_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"np": importlib.import_module("numpy")}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_readme_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples write their models to the working directory
    blocks = _python_blocks(ROOT / "README.md")
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:  # the README reads top to bottom: later blocks use earlier names
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["w4"].dtype.name == "int4" and namespace["packed"].size == namespace["w4"].size // 2


@pytest.mark.parametrize("page", [p for p in PAGES if _python_blocks(p)], ids=_rel)
def test_docs_examples_run(tmp_path, monkeypatch, page):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in _python_blocks(page):  # a page reads top to bottom: later blocks use earlier names
        exec(compile(block, _rel(page), "exec"), namespace)


def test_docs_examples_found():
    """The pages that teach by example have examples the test above runs."""
    with_examples = {_rel(p) for p in PAGES if _python_blocks(p)}
    expected = {
        "docs/guides/quantize-a-model.md",
        "docs/guides/large-models.md",
        "docs/guides/training.md",
        "docs/guides/running-qdq-models.md",
        "docs/reference/operators.md",
        "docs/reference/onnx.md",
        "docs/reference/report.md",
    }
    assert expected <= with_examples, expected - with_examples


def test_readme_commands_match_ci():
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && python -m pytest" in text
    assert "pip install -e '.[test]' && python -m pytest" in ci
    # The first command sets up with the core dependencies only and runs the main job.
    assert "pip install -e . && qlinear quantize --demo" in text.split("```")[1]


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) < 150


def test_semantics_doc_names_only_existing_tests():
    text = (DOCS / "semantics.md").read_text()
    tests = (ROOT / "tests" / "test_semantics.py").read_text()
    named = re.findall(r"[(,] ?`(test_[a-z0-9_]+)`", text)
    assert len(named) >= 15
    for name in named:
        assert f"def {name}(" in tests, name


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links(path: pathlib.Path) -> list[str]:
    return [target for target in _LINK.findall(_FENCE.sub("", path.read_text())) if "://" not in target]


def test_docs_links_resolve():
    """Every relative link in README.md and docs/ names a file that exists, and an anchor that its page has."""
    broken = []
    for page in ALL_MARKDOWN:
        for target in _links(page):
            if target.startswith("mailto:"):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if dest in GENERATED:  # made by a later step; see GENERATED
                continue
            if not dest.is_file():
                broken.append(f"{_rel(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{_rel(page)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_notes_are_dated_and_say_how_they_measured():
    """Each note is named YYYY-MM-DD-topic.md, opens with that date, and gives its machine and its command."""
    notes = sorted(NOTES.glob("*.md"))
    assert notes
    for note in notes:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d-[a-z0-9-]+\.md", note.name), note.name
        text = note.read_text()
        assert text.startswith(f"# {note.name[:10]}: "), note.name
        assert "**Machine**" in text and "**Command" in text, note.name


def _resolves(dotted: str) -> bool:
    """Whether ``qlinear.a.b.C`` names a module or an attribute of one."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_docs_names_exist():
    """The Python names and the files the guides, references and explanations cite exist (notes are a record)."""
    missing = []
    for page in [ROOT / "README.md", *PAGES]:
        text = _FENCE.sub("", page.read_text())
        for dotted in sorted(set(re.findall(r"`(qlinear(?:\.[A-Za-z_]\w*)+)", text))):
            if not _resolves(dotted):
                missing.append(f"{_rel(page)}: {dotted}")
        for cited in sorted(set(re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.py)(?:::\w+)?`", text))):
            if not any((base / cited).is_file() for base in (ROOT, ROOT / "src", ROOT / "src" / "qlinear")):
                missing.append(f"{_rel(page)}: {cited}")
    assert not missing, "\n".join(missing)


def _key_paths(value, prefix: str = "") -> set[str]:
    """Every key of a report as ``a.b`` (``a[].b`` inside lists), without descending into name-keyed maps."""
    paths = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}{key}"
            paths.add(path)
            if key not in ("settings", "float_by_design", "sqnr_db_outputs"):  # options, or keyed by node/output name
                paths |= _key_paths(item, path + ".")
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        paths |= _key_paths(value[0], prefix[:-1] + "[].")
    return paths


def test_report_doc_names_every_key(tmp_path, monkeypatch):
    """docs/reference/report.md lists every key a quantizer run's report has."""
    import qlinear.quantize as qq

    monkeypatch.chdir(tmp_path)
    demo = resources.files("qlinear.quantize") / "_demo"
    result = qq.quantize_model(
        str(demo / "digits_cnn.onnx"), "digits.qdq.onnx", str(demo / "digits_calibration.npz"),
        eval=str(demo / "digits_eval.npz"), labels="label",
    )  # fmt: skip
    documented = set(re.findall(r"^\| `([^`]+)` \|", (DOCS / "reference" / "report.md").read_text(), re.M))
    missing = sorted(_key_paths(result.report) - documented)
    assert not missing, missing
