"""The README: its two commands are what CI runs and install what the code imports; it stays short (the rest is
in docs/), every relative link of it and of docs/ resolves, and its front matter is a valid Space card."""
import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from huggingface_hub import SpaceCard

from specdec.models import entries

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 200  # what it is, the two commands, the API, the tabs, one line per command, links
OPTIONAL = {"spaces"}  # imported only where installed (a Hugging Face Space provides it)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)  # code blocks: no headings there
CODE = re.compile(FENCE.pattern + r"|`[^`\n]*`", re.MULTILINE | re.DOTALL)  # code blocks and spans: no links there


def readme_line(fragment: str) -> str:
    return next(line for line in README.read_text().splitlines() if fragment in line)


def requirement_names(name: str) -> set[str]:
    lines = [line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines()]
    return {normal(line.split("==")[0]) for line in lines if line}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    install, tests = readme_line("pip install -r requirements.txt"), readme_line("python -m pytest")
    assert install.endswith(" && python app.py") and "python3 -m venv .venv" in install
    assert "grep -m1 -F 'pip install -r requirements.txt' README.md" in ci
    assert "grep -m1 -F 'python -m pytest' README.md" in ci
    assert "-r assets/requirements-models.txt" in install and tests.startswith(". .venv/bin/activate")
    assert "pip install -r requirements-test.txt" in tests and "requirements-test" not in install


def test_every_requirement_is_pinned_exactly():
    for name in ("requirements.txt", "requirements-test.txt", "assets/requirements-models.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            assert not line or "==" in line, f"{name}: {line!r} is not pinned with =="


def imported_packages() -> set[str]:
    """Top-level third-party modules imported by specdec/ and app.py."""
    names = set()
    for path in [*(ROOT / "specdec").rglob("*.py"), ROOT / "app.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "specdec"}


def test_requirements_hold_what_the_app_imports_and_no_test_tool():
    runtime, tools = requirement_names("requirements.txt"), requirement_names("requirements-test.txt")
    installed = packages_distributions()
    imported = imported_packages()
    assert {"torch", "gradio", "transformers"} <= imported and imported - set(installed) == OPTIONAL
    for module in imported - OPTIONAL:
        assert {normal(d) for d in installed[module]} & runtime, f"{module} is imported but not in requirements.txt"
    assert "pytest" in tools and not tools & runtime  # a Space installs requirements.txt: no test tools there
    assert not {normal(d) for m in imported - OPTIONAL for d in installed[m]} & tools  # nor does the app need them


def test_the_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path):
    """The anchors of `path`'s headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", path.read_text(encoding="utf-8")), re.MULTILINE):
        base = slug(heading)
        seen[base] = seen.get(base, -1) + 1
        yield base if seen[base] == 0 else f"{base}-{seen[base]}"


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """'file: target' for every relative link (and its #anchor) in `path` that does not resolve."""
    broken = []
    for target in LINK.findall(CODE.sub("", path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.is_file() or (anchor and anchor not in set(anchors(linked))):
            broken.append(f"{path.relative_to(root)}: {target}")
    return broken


def test_every_relative_link_resolves():
    documents = [README, *sorted((ROOT / "docs").glob("*.md"))]
    assert len(documents) >= 6
    broken = [link for path in documents for link in broken_links(path)]
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)


def test_the_link_check_can_fail(tmp_path):
    (tmp_path / "a.md").write_text("# The engine's contract\n## `--dtype auto`: int8\n```\n# not a heading\n```\n"
                                   "[ok](#the-engines-contract) [gone](b.md) [bad anchor](a.md#nowhere) "
                                   "[web](https://example.org) `[code](c.md)` [dtype](#--dtype-auto-int8) "
                                   "[in code](#not-a-heading)\n")
    (tmp_path / "b.md").write_text("x")
    assert broken_links(tmp_path / "a.md", tmp_path) == ["a.md: a.md#nowhere", "a.md: #not-a-heading"]
    (tmp_path / "b.md").unlink()
    assert broken_links(tmp_path / "a.md", tmp_path)[0] == "a.md: b.md"
    assert slug("`--dtype auto`: bfloat16, else float32") == "--dtype-auto-bfloat16-else-float32"


def test_the_front_matter_is_a_space_card_listing_the_catalogue():
    card = SpaceCard.load(README).data
    assert (card.sdk, card.app_file) == ("gradio", "app.py")
    assert card.license and card.tags and card.suggested_hardware
    assert 0 < len(card.short_description) <= 60  # the Hub's limit
    catalogue = [entries.find(name) for name in entries.names()]
    hub_ids = [entry.hub_id for entry in catalogue if entry.hub_id]
    assert card.models == hub_ids and len(hub_ids) >= 2
    pair = [entries.find(entries.default_name(role)).hub_id for role in ("target", "draft")]
    assert card.preload_from_hub == pair


def test_every_dashboard_variable_is_documented_for_hosts():
    read = set(re.findall(r"SPECDEC_[A-Z_]+", (ROOT / "specdec/dashboard/config.py").read_text()))
    hosting = (ROOT / "docs/hosting.md").read_text(encoding="utf-8")
    assert len(read) > 10 and not {v for v in read if v not in hosting}
