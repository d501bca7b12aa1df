"""The generated files are what the model says: the CRD, the chart's copy and docs/resource.md's tables.

As controller-gen users check in CI: a field added to ``compilecache.api.model`` without
``make generate`` (or a hand edit of a generated file) fails here, naming the file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compilecache.api import generate, model

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", sorted(generate.outputs(ROOT)), ids=str)
def test_the_committed_file_is_what_the_generator_writes(path: Path) -> None:
    expected = generate.outputs(ROOT)[path]
    assert (ROOT / path).read_text() == expected, f"{path} is stale: run `make generate`"


def test_the_check_names_a_stale_file(tmp_path: Path) -> None:
    """``--check`` exits 1 naming what differs (a copy of the repository's generated files, one edited)."""
    for path in generate.outputs(ROOT):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text())
    assert generate.main(["--check", str(tmp_path)]) == 0
    chart = tmp_path / generate.CHART_CRD
    chart.write_text(chart.read_text().replace("maxLength: 253", "maxLength: 254", 1))
    assert generate.stale(tmp_path) == [generate.CHART_CRD]
    assert generate.main(["--check", str(tmp_path)]) == 1


def test_docs_without_markers_are_refused() -> None:
    with pytest.raises(ValueError, match="markers of the spec table"):
        generate.resource_docs("# CompileCache\n\n## spec\n| field |\n")


def test_the_schema_is_structural_openapi() -> None:
    """No JSON Schema that the API server refuses in a CRD: no $ref, no null, no title, no docs rows."""
    text = yaml.safe_dump(generate.openapi_schema())
    for word in ("$ref", "$defs", "'null'", "title:", generate.DOC_KEY, "const:"):
        assert word not in text, word


def test_a_field_of_the_model_reaches_the_crd_and_the_docs() -> None:
    """One edit in the model: its description, bounds, default and docs row all come from it."""
    node = generate.openapi_schema()["properties"]["spec"]["properties"]["warmup"]["properties"]["backoffLimit"]
    field = model.Warmup.model_fields["backoffLimit"]
    assert node["description"] == field.description
    assert node["default"] == field.default
    assert node["format"] == "int32" and node["minimum"] == 0
    assert "| `warmup.backoffLimit` |" in generate.table("spec")


@pytest.mark.slow
def test_make_generate_runs_as_a_module() -> None:
    """The entry `make generate` uses: the module's own command line, against the repository (check only)."""
    done = subprocess.run(
        [sys.executable, "-m", "compilecache.api.generate", "--check", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
