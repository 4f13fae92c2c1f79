"""The README's two commands are what CI runs, and they install what the code imports."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_line(fragment: str) -> str:
    return next(line for line in (ROOT / "README.md").read_text().splitlines() if fragment in line)


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    install, tests = readme_line("pip install -r requirements.txt"), readme_line("python -m pytest")
    assert install.endswith(" && python app.py") and "python3 -m venv .venv" in install
    assert "grep -m1 -F 'pip install -r requirements.txt' README.md" in ci
    assert "grep -m1 -F 'python -m pytest' README.md" in ci
    assert "-r assets/requirements-models.txt" in install and tests.startswith(". .venv/bin/activate")


def test_every_requirement_is_pinned_exactly():
    for name in ("requirements.txt", "assets/requirements-models.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            assert not line or "==" in line, f"{name}: {line!r} is not pinned with =="
