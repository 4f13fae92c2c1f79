"""The teaching notebooks execute top to bottom on tiny models (their cells assert their own claims)."""
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def execute(notebook):
    NotebookClient(notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return notebook


def test_there_are_three_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["01_one_round_by_hand.ipynb", "02_lossless_rejection_sampling.ipynb",
                                           "03_reading_a_benchmark.ipynb"]


def test_kernel_runs_this_python_and_imports_specdec():
    cell = new_code_cell("import sys, specdec; print(sys.prefix)")
    execute(new_notebook(cells=[cell]))
    stdout = "".join(o["text"] for o in cell.outputs if o.get("name") == "stdout")
    assert stdout.strip() == sys.prefix  # the venv's interpreter, not whatever "python" is first on PATH


def built():
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import build
    finally:
        sys.path.pop(0)
    return build


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_as_built_with_its_outputs(path):
    """The committed cells are build.py's, every code cell that prints has its output stored, none an error."""
    build = built()
    committed = nbformat.read(path, as_version=4)
    fresh = build.notebook(path.name)
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in fresh.cells], \
        "notebook differs from notebooks/build.py: run python notebooks/build.py"
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code if "print(" in c.source)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]


def test_each_notebook_links_to_the_next():
    for path, following in zip(NOTEBOOKS, NOTEBOOKS[1:]):
        last = nbformat.read(path, as_version=4).cells[-1]
        assert last.cell_type == "markdown" and f"({following.name})" in last.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_and_prints_what_is_committed(path):
    """Re-executed from scratch, every cell prints the committed numbers (cells tagged timings only run)."""
    build = built()
    committed = nbformat.read(path, as_version=4)
    fresh = build.execute(build.notebook(path.name))
    assert not [o for c in fresh.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert build.printed(fresh) == build.printed(committed)
