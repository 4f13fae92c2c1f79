"""SIGKILL at random moments of every writer of the cache and of a run folder: GGUF conversion, the int8 store,
the int4 store, a distillation (checkpoints, LATEST, draft/, report.json, its registration) and a bench.

Each writer runs once uninterrupted (its reference result, and its duration D), then is killed KILLS times, each
after a delay drawn in [0, D) from SEED (the test id shows the seed and the fraction of D). After a kill: what
a reader opens is whole and bitwise the reference's, or absent; what the run had finished (its journal) or what
was whole before it started is still whole; `cache.clean_stale()` leaves no partial; a second run ends with
the reference result and leaves no partial either. Runs fork from one child that imported torch once
(`faults.Forker`), so twenty kills take seconds each, not an import of torch each.
"""
import csv
import hashlib
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from safetensors.torch import load_file

from faults import Forker, read_journal
from specdec.core import files
from specdec.models import cache, load_model, loading, quant_store
from specdec.testing import tiny_folder, tiny_model, tiny_tokenizer
from test_models_gguf import write_tiny_gguf
from tiny_models import write_tiny_models

SEED = 20  # the kill moments' draw
KILLS = 4  # per writer: 5 writers, 20 kills
PRELOAD = """
import accelerate, gguf, plotly.graph_objects, plotly.subplots, safetensors.torch, torch, transformers
import transformers.models.llama.modeling_llama
from transformers import AutoModelForCausalLM, AutoTokenizer
import faults
from specdec.cli import main
"""
JOURNALED = """
from faults import journal
from specdec.lab.bench import run as bench_run
from specdec.training import distill
save_checkpoint, append_row = distill._save_checkpoint, bench_run.append_row
def saved(checkpoint, accelerator, trained, optimizer, report):
    save_checkpoint(checkpoint, accelerator, trained, optimizer, report)
    journal(report.steps_done)
def appended(out, row):
    append_row(out, row)
    journal([row["draft"], row["k"], row["prompt_id"]])
distill._save_checkpoint, bench_run.append_row = saved, appended
"""


def cli_run(argv: list[str]) -> str:
    """Code running `python -m specdec ARGV`, journaled: its checkpoints, its bench cells, then "done"."""
    return (f"{JOURNALED}\nfrom specdec.cli import main\nstatus = main({argv!r})\n"
            "journal('done')\nraise SystemExit(status)\n")


@dataclass
class Places:
    """Where one run writes: its cache, its run folder (distill and bench), and its journal."""

    cache: Path
    run: Path
    journal: Path

    def env(self) -> dict[str, str]:
        return {"SPECDEC_CACHE": str(self.cache), "KILL_JOURNAL": str(self.journal)}


def digest(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """{file name: sha256} of every file in `folder` (a whole result is bitwise equal to the reference's)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in skip}


def leftovers(folder: Path) -> list[str]:
    """Partials and writer tokens under `folder`: what a killed write leaves and cleanup must remove."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if files.in_progress(p))


class Writer:
    """One writer under kills: what it runs, what it leaves, and what of it a reader may see."""

    name = ""

    def code(self, world, places: Places) -> str:
        raise NotImplementedError

    def second(self, world, places: Places) -> str:
        """The run after the kill."""
        return self.code(world, places)

    def seed(self, world, places: Places) -> None:
        """What is whole in the cache before the run starts."""

    def result(self, world, places: Places):
        """The finished result, compared with the reference run's."""
        raise NotImplementedError

    def after_kill(self, world, places: Places, reference) -> None:
        """What a reader may see right after the kill (and what must have survived it)."""
        raise NotImplementedError


class Conversion(Writer):
    """A GGUF converted to float32, then bfloat16 cast from it (`convert.ensure_converted`)."""

    name = "gguf-conversion"
    dtypes = ("float32", "bfloat16")

    def code(self, world, places):
        return ("from faults import journal; from specdec.models import load_model\n"
                + "".join(f"load_model({str(world.gguf)!r}, dtype={d!r}); journal({d!r})\n" for d in self.dtypes))

    def result(self, world, places):
        return {dtype: digest(self.folder(world, dtype)) for dtype in self.dtypes}

    def folder(self, world, dtype: str) -> Path:
        return cache.converted_dir(loading._gguf_key(world.gguf)[0], dtype)

    def after_kill(self, world, places, reference):
        done = read_journal(places.journal)
        for dtype in self.dtypes:
            folder = self.folder(world, dtype)
            assert folder.is_dir() or dtype not in done, f"{dtype} was converted, then lost"
            if folder.is_dir():
                assert digest(folder) == reference[dtype], f"a reader would open a partial {dtype} folder"


class Store(Writer):
    """A quantized store: `load_model(source, quant=...)` on a cache holding `seeded` (journaled once made)."""

    quant = ""

    def source(self, world) -> Path:
        raise NotImplementedError

    def seeded(self, world) -> Path:
        raise NotImplementedError

    def code(self, world, places):
        return (f"from faults import journal; from specdec.models import load_model\n"
                f"load_model({str(self.source(world))!r}, quant={self.quant!r}); journal({self.quant!r})\n")

    def seed(self, world, places):
        shutil.copytree(self.seeded(world), places.cache, dirs_exist_ok=True)


class Int8Store(Store):
    """The int8 store of a GGUF, made straight from its tensors, next to a float32 conversion made earlier."""

    name, quant = "int8-store", "int8"

    def source(self, world):
        return world.gguf

    def seeded(self, world):
        return world.float32_cache

    def stores(self, world) -> tuple[Path, Path]:
        key = loading._gguf_key(world.gguf)[0]
        return cache.converted_dir(key, "int8"), cache.converted_dir(key, "float32")

    def result(self, world, places):
        store, float32 = self.stores(world)
        return digest(store), digest(float32)

    def after_kill(self, world, places, reference):
        store, float32 = self.stores(world)
        assert digest(float32) == reference[1], "the float32 conversion next to the store was damaged"
        assert store.is_dir() or "int8" not in read_journal(places.journal), "the int8 store was made, then lost"
        if store.is_dir():
            assert digest(store) == reference[0], "a reader would open a partial int8 store"


class Int4Store(Store):
    """The int4 store of a folder, replacing one of an older format (a folder moved aside, then replaced)."""

    name, quant = "int4-store", "int4"

    def source(self, world):
        return world.folder

    def seeded(self, world):
        return world.old_int4_cache

    def store(self, world) -> Path:
        return quant_store.store_folder(world.folder, quant_store.INT4)

    def result(self, world, places):
        return digest(self.store(world))

    def after_kill(self, world, places, reference):
        store = self.store(world)
        if not store.is_dir():  # killed between moving the old store aside and renaming the new one in
            assert list(store.parent.glob(f"{store.name}{files.PARTIAL}*{files.PREVIOUS}")), "the old store was lost"
            cache.clean_stale()
        assert digest(store) in (world.old_int4, reference), "a reader would open a partial int4 store"
        assert digest(store) == reference or "int4" not in read_journal(places.journal)


class Distillation(Writer):
    """`distill` with a checkpoint every step, then `--resume` (tests/test_faults_distill.py's tiny run)."""

    name = "distillation"
    steps = 5

    def argv(self, world, places) -> list[str]:
        return ["distill", "--target", world.models["target"], "--draft", world.models["draft"], "--prompts",
                str(world.prompts), "--steps", str(self.steps), "--checkpoint-every", "1", "--eval-every", "0",
                "--eval-limit", "1", "--eval-max-new-tokens", "4", "--max-new-tokens", "6", "--batch-size", "2",
                "--top-k", "8", "--lr", "1e-2", "--out", str(places.run), "--name", "killed"]

    def code(self, world, places, *extra):
        return cli_run(self.argv(world, places) + list(extra))

    def second(self, world, places):
        return self.code(world, places, "--resume")

    def result(self, world, places):
        checkpoints = sorted(p.name for p in (places.run / "checkpoint").iterdir())
        return (self.report(places.run / "report.json"), digest(places.run / "draft"), checkpoints,
                digest(cache.root() / "aligned" / "killed", skip=("card.json",)))

    @staticmethod
    def report(path: Path) -> dict:
        return {k: v for k, v in json.loads(path.read_text()).items() if k != "wall_time_s"}

    def after_kill(self, world, places, reference):
        report, draft, _, registered = reference
        done = read_journal(places.journal)
        checkpoint = places.run / "checkpoint"
        steps = [step for step in done if isinstance(step, int)]
        if (checkpoint / "LATEST").exists():
            latest = checkpoint / (checkpoint / "LATEST").read_text()
            assert cache.is_ready(latest), "LATEST names a partial checkpoint"
            saved = json.loads((latest / "trainer_state.json").read_text())["steps_done"]
            assert latest.name == f"step-{saved:08d}" and saved >= max(steps, default=0), "a checkpoint was lost"
            assert [r["step"] for r in saved_losses(latest)] == list(range(1, saved + 1))
        else:
            assert not steps, "a checkpoint was saved, then lost"
        for folder in checkpoint.glob("step-*"):
            assert files.in_progress(folder) or cache.is_ready(folder), f"{folder.name} is a partial under a final name"
        outputs = {"report.json": places.run / "report.json", "draft": places.run / "draft",
                   "registered": cache.root() / "aligned" / "killed"}
        assert "done" not in done or all(path.exists() for path in outputs.values())
        if outputs["report.json"].exists():
            assert self.report(outputs["report.json"]) == report
        if outputs["draft"].exists():
            assert digest(outputs["draft"]) == draft, "a reader would open a partial draft/"
        if outputs["registered"].exists():
            assert digest(outputs["registered"], skip=("card.json",)) == registered
            json.loads((outputs["registered"] / "card.json").read_text())


def saved_losses(step_folder: Path) -> list[dict]:
    return json.loads((step_folder / "trainer_state.json").read_text())["losses"]


MEASURED = ("calibrated_c", "verify_curve")  # bench row fields that hold timings (besides the float ones)
COUNTED = ("acceptance_rate", "mean_accepted_length")  # float fields that are rates of counts, not timings


class Bench(Writer):
    """`bench` of a model draft and lookup on four prompts (tests/test_faults_bench.py's tiny run), then again."""

    name = "bench"

    def code(self, world, places):
        argv = ["bench", "--target", world.bench["target"], "--draft", world.bench["draft"], "lookup", "--prompts",
                "tiny", "--limit", "2", "--k", "2", "--max-new-tokens", "5", "--dtype", "float32", "--draft-dtype",
                "float32", "--no-hf-generate", "--out", str(places.run)]
        return cli_run(argv)

    @staticmethod
    def rows(run: Path) -> dict[tuple, dict]:
        """The complete rows of results.jsonl by cell, their fields that count (not time)."""
        lines = (run / "results.jsonl").read_bytes().split(b"\n") if (run / "results.jsonl").exists() else [b""]
        rows = [json.loads(line) for line in lines[:-1]]  # the last item: b"", or a line cut by the kill
        keyed = {(r["draft"], r["k"], r["prompt_id"]): {k: v for k, v in r.items() if counted(k, v)} for r in rows}
        assert len(keyed) == len(rows), "a cell was measured twice"
        return keyed

    def result(self, world, places):
        names = sorted(p.name for p in places.run.iterdir())
        return (self.rows(places.run), names, (places.run / "plotly.min.js").read_bytes(),
                json.loads((places.run / "config.json").read_text()))

    def after_kill(self, world, places, reference):
        rows, _, bundle, config = reference
        done = read_journal(places.journal)
        found = self.rows(places.run)
        assert all(found[key] == rows[key] for key in found), "a row differs from the uninterrupted run's"
        assert {tuple(key) for key in done if isinstance(key, list)} <= set(found), "a finished cell was lost"
        for path in sorted(places.run.iterdir()) if places.run.is_dir() else []:
            if files.in_progress(path):
                continue
            if path.name == "config.json":
                assert json.loads(path.read_text()) == config
            elif path.suffix == ".html":
                assert path.read_text().rstrip().endswith("</html>"), f"{path.name} is cut short"
            elif path.name == "plotly.min.js":
                assert path.read_bytes() == bundle, "the charts' plotly.min.js is cut short"
            elif path.suffix == ".csv":
                table = list(csv.reader(path.open()))
                assert len(table) > 1 and all(len(line) == len(table[0]) for line in table), "results.csv is cut"
            elif path.suffix == ".md":
                assert path.read_text().endswith("\n"), f"{path.name} is cut short"
        for path in places.cache.rglob("*.json"):
            if not files.in_progress(path):
                json.loads(path.read_text())  # a calibration cut short would not parse


def counted(name: str, value) -> bool:
    """Whether a bench row field is a count (equal in every run), not a timing."""
    timing = isinstance(value, float) or (isinstance(value, list) and any(isinstance(v, float) for v in value))
    return name in COUNTED or not (timing or name in MEASURED)


WRITERS = {writer.name: writer for writer in (Conversion(), Int8Store(), Int4Store(), Distillation(), Bench())}
_draw = random.Random(SEED)
MOMENTS = [(name, round(_draw.random(), 3)) for name in WRITERS for _ in range(KILLS)]


@dataclass
class World:
    """The inputs every run reads, made once."""

    gguf: Path  # a tiny float32 GGUF
    folder: Path  # a tiny HF folder
    models: dict  # tiny target and draft folders sharing a tokenizer
    prompts: Path  # six prompts, two held out
    bench: dict  # tiny target and draft folders covering the `tiny` suite's ids
    float32_cache: Path  # a cache holding the GGUF's float32 conversion
    old_int4_cache: Path  # a cache holding an int4 store of `folder` in an older format
    old_int4: dict  # that store's digest


@pytest.fixture(scope="module")
def forker():
    forker = Forker(PRELOAD)
    yield forker
    forker.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("kills")
    gguf = root / "weights" / "tiny.gguf"
    gguf.parent.mkdir()
    write_tiny_gguf(gguf, tiny_model("llama", 0, vocab_size=300))
    folder = tiny_folder(root / "folder", seed=0)
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "category": "c", "prompt": f"the tiny prompt number {i}",
                                             "template": "raw", "split": "heldout" if i >= 4 else "dev"})
                                 for i in range(6)))
    rows = 128 - len(tiny_tokenizer())  # the `tiny` suite's ids are < 128
    bench = {role: str(tiny_folder(root / f"bench-{role}", seed=seed, extra_rows=rows))
             for role, seed in (("target", 0), ("draft", 1))}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE", str(root / "float32-cache"))
        load_model(str(gguf), dtype="float32")
        patch.setenv("SPECDEC_CACHE", str(root / "old-int4-cache"))
        load_model(str(folder), quant="int4")
        store = quant_store.store_folder(folder, quant_store.INT4)
        marker = store / quant_store.INT4.marker
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "format": 0}))
        (store / cache.READY).unlink()
        cache.mark_ready(store)
        old_int4 = digest(store)
    return World(gguf, folder, write_tiny_models(root / "models", context=128), prompts, bench,
                 root / "float32-cache", root / "old-int4-cache", old_int4)


@pytest.fixture(scope="module")
def references(world, forker, tmp_path_factory):
    """{writer: (seconds an uninterrupted run takes, its result)}, each measured on first use."""
    made = {}

    def reference(writer: Writer, monkeypatch):
        if writer.name not in made:
            places = fresh_places(tmp_path_factory.mktemp(f"reference-{writer.name}"), monkeypatch)
            writer.seed(world, places)
            run = forker.run(writer.code(world, places), places.env())
            assert run.status == 0, run.log[-3000:]
            made[writer.name] = run.seconds, writer.result(world, places)
        return made[writer.name]
    return reference


def fresh_places(folder: Path, monkeypatch) -> Places:
    places = Places(folder / "cache", folder / "run", folder / "journal")
    places.cache.mkdir()
    monkeypatch.setenv("SPECDEC_CACHE", str(places.cache))
    return places


@pytest.mark.parametrize("name, fraction", MOMENTS,
                         ids=[f"{name}-seed{SEED}-at{fraction:.3f}D" for name, fraction in MOMENTS])
def test_a_writer_killed_at_a_random_moment_leaves_no_partial_and_the_next_run_completes(
        world, forker, references, tmp_path, monkeypatch, name, fraction):
    writer = WRITERS[name]
    seconds, reference = references(writer, monkeypatch)
    places = fresh_places(tmp_path, monkeypatch)
    writer.seed(world, places)
    killed = forker.run(writer.code(world, places), places.env(), kill_after=fraction * seconds)
    assert killed.killed or killed.status == 0, killed.log[-3000:]
    writer.after_kill(world, places, reference)
    cache.clean_stale()
    assert leftovers(places.cache) == []
    again = forker.run(writer.second(world, places), places.env())
    assert again.status == 0, again.log[-3000:]
    assert writer.result(world, places) == reference
    assert leftovers(places.cache) == [] and (not places.run.exists() or leftovers(places.run) == [])
