"""User-facing text speaks of the product and the literature: no internal document ids, issue numbers or paths."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USER_FACING = ("README.md", "app.py", "specdec", "assets", "docs", "notebooks")  # files, or folders whose
# .py, .md, .ipynb, .json and .jsonl files are read (docstrings and catalogue titles are read by users too)
SUFFIXES = (".py", ".md", ".ipynb", ".json", ".jsonl")
INTERNAL = re.compile(r"seed 0|seed-0|000_e22e|003_a69e|issue [0-9]|issue #|MEASURED\.md|heavy lock|/work/",
                      re.IGNORECASE)  # labels only the project's own documents use


def user_facing_files() -> list[Path]:
    files = []
    for name in USER_FACING:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES)
    return files


def internal_labels(path: Path) -> list[str]:
    """'file:line: text' for every line of `path` that names an internal label."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for number, line in enumerate(lines, 1) if INTERNAL.search(line)]


def test_the_user_facing_files_are_there():
    names = {p.relative_to(ROOT).as_posix() for p in user_facing_files()}
    assert {"README.md", "app.py", "specdec/lab/probe.py", "notebooks/build.py"} <= names
    # the README's detail lives in docs/, read as the README is
    assert {"docs/aligned-drafts.md", "docs/drafters.md", "docs/hosting.md", "docs/performance.md"} <= names
    assert any(n.startswith("specdec/lab/bench/") for n in names) and any(n.endswith(".ipynb") for n in names)


def test_user_facing_text_has_no_internal_labels():
    found = [hit for path in user_facing_files() for hit in internal_labels(path)]
    assert not found, "internal labels in user-facing text:\n" + "\n".join(found)


def test_the_grep_finds_what_it_looks_for():
    assert INTERNAL.search("as Seed 003's table") and INTERNAL.search("see issue #6")
    assert INTERNAL.search("run it under the heavy lock") and INTERNAL.search("cited in MEASURED.md")
    assert not INTERNAL.search("sampling seed (default 0)") and not INTERNAL.search("the round table")
