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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path):
    notebook = execute(nbformat.read(path, as_version=4))
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert any(c.outputs for c in notebook.cells if c.cell_type == "code")
