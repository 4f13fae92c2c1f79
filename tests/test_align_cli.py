"""The alignment CLIs end to end on tiny models saved as folders: tokenizers, align, distill, experiment."""
import json
import os
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.cli import main
from specdec.drafters.tokenizers import shared_token_map
from specdec.models import aligned
from specdec.testing import tiny_bpe_tokenizer, tiny_model


def save(folder, arch, seed, tokenizer, **kwargs):
    model = tiny_model(arch, seed=seed, vocab_size=len(tokenizer), **kwargs)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target_tok, other_tok = tiny_bpe_tokenizer("bytelevel", 400), tiny_bpe_tokenizer("metaspace", 300)
    prompts = root / "prompts.jsonl"
    texts = ["def price(option, curve):", "import QuantLib as ql", "The risk of the", "df['EBITDA_Margin'] =",
             "def CalcBlackScholesVega(S, K, T, r, sigma):", "return option.npv("]
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": "finance", "template": "raw", "prompt": t,
                                           "split": "heldout" if i >= 4 else "dev"}) + "\n"
                               for i, t in enumerate(texts)))
    return {"target": save(root / "target", "llama", 0, target_tok),
            "same": save(root / "same", "llama", 1, target_tok, layers=1),
            "other": save(root / "other", "llama", 2, other_tok, layers=1, hidden=32),
            "prompts": str(prompts), "root": root}


def test_tokenizers_prints_the_report(folders, capsys):
    assert main(["tokenizers", "--target", folders["target"], "--draft", folders["other"], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is False and report["target_embedding_rows"] == 400
    assert 0 < report["boundary_mismatch_rate"] < 1


def test_align_writes_a_draft_that_loads_with_the_target_tokenizer(folders, capsys):
    out = folders["root"] / "aligned"
    assert main(["align", "--target", folders["target"], "--draft", folders["other"], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "vllm serve" in printed and "warning" not in printed
    assert json.loads((out / "alignment.json").read_text())["rows"] == 400
    assert main(["tokenizers", "--target", folders["target"], "--draft", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"] is True


def test_distill_refuses_an_unaligned_draft(folders, capsys):
    code = main(["distill", "--target", folders["target"], "--draft", folders["other"], "--prompts",
                 folders["prompts"], "--steps", "2", "--out", str(folders["root"] / "refused")])
    assert code == 1 and "vocabulary mismatch" in capsys.readouterr().err


@pytest.mark.parametrize("draft", ["self:1", "lookup", "d+lookup", "d@vocab=v.json"])
def test_distill_refuses_a_draft_that_is_not_a_model(folders, capsys, draft):
    code = main(["distill", "--target", "no-such-target", "--draft", draft, "--prompts", folders["prompts"],
                 "--steps", "2", "--out", str(folders["root"] / "refused-kind")])
    assert code == 1 and "distillation trains a draft model" in capsys.readouterr().err  # before any model loads


def test_distill_runs_as_two_processes_under_torchrun(folders):
    """What `accelerate launch --multi_gpu` does on GPUs, on CPU: torchrun, gloo, each rank a slice of a batch."""
    aligned, out = folders["root"] / "aligned-for-ddp", folders["root"] / "ddp"
    assert main(["align", "--target", folders["target"], "--draft", folders["other"], "--out", str(aligned)]) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "specdec", "distill",
               "--target", folders["target"], "--draft", str(aligned), "--prompts", folders["prompts"],
               "--steps", "4", "--eval-every", "0", "--max-new-tokens", "6", "--eval-max-new-tokens", "6",
               "--threads", "1", "--out", str(out)]
    environment = os.environ | {"SPECDEC_CACHE": str(folders["root"] / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["processes"] == 2 and report["steps_done"] == 4 and len(report["evals"]) == 2
    assert done.stdout.count("held-out acceptance") == 1  # only the main process reports
    assert [p.name for p in (out / "data").iterdir()] == [p.name for p in (out / "data").glob("*.jsonl")]
    trained = AutoModelForCausalLM.from_pretrained(out / "draft").lm_head.weight
    assert not trained.equal(AutoModelForCausalLM.from_pretrained(aligned).lm_head.weight)


def experiment_args(folders, out):
    return ["experiment", "align-distill", "--target", folders["target"], "--same-draft", folders["same"],
            "--other-draft", folders["other"], "--prompts", folders["prompts"], "--steps", "3", "--eval-every", "0",
            "--max-new-tokens", "6", "--eval-max-new-tokens", "6", "--measure-max-new-tokens", "8", "--k", "3",
            "--most-frequent", "50", "--generation-batch", "3", "--out", str(out)]


def test_experiment_runs_every_stage_and_writes_the_table(folders, capsys):
    out = folders["root"] / "experiment"
    assert main(experiment_args(folders, out)) == 0
    domain = out / "prompts"
    report = json.loads((domain / "distill" / "report.json").read_text())
    assert report["steps_done"] == 3 and report["evals"] == []  # held-out α̂ is the measure stage's
    assert (domain / "distill" / "loss.html").stat().st_size > 1000
    assert json.loads((domain / "report.json").read_text())["identical"] is False
    data = json.loads((domain / "data.json").read_text())
    assert data["prompts"] == 4 and data["generation_batch"] == 3 and data["identical_to_one_at_a_time"] == "2/2"
    assert data["sequences"] == 4 * (1 + data["samples"]) and data["samples"] == 1  # greedy + sampled per prompt
    card = aligned.find("aligned:" + aligned.name_for("other-prompts"))  # the distilled draft, in the registry
    assert card.method == "transplant+distill" and card.steps == 3 and card.domain == "prompts"
    rows = json.loads((domain / "results.json").read_text())["rows"]
    assert card.held_out_acceptance == rows[5]["acceptance_rate"]  # row (e), filled in after measuring
    assert len(list((domain / "costs").glob("target-*.json"))) == 1  # v(n) calibrated once for every row
    assert len(list((domain / "costs").glob("draft-*.json"))) == 6
    assert [r["draft"][:3] for r in rows] == ["tar", "(a)", "(b)", "(c)", "(d)", "(e)", "(f)"]
    assert all(r["identical_outputs"] == "2/2" for r in rows)  # greedy: every draft leaves the output unchanged
    assert all(r["predicted_speedup"] > 0 and r["measured_speedup"] > 0 for r in rows)
    assert "| (f) (e) with a pruned vocabulary |" in (domain / "table.md").read_text()
    vocabulary = json.loads((domain / "prune" / "vocabulary.json").read_text())
    own = shared_token_map(AutoTokenizer.from_pretrained(folders["target"]),
                           AutoTokenizer.from_pretrained(folders["other"]))  # the tokens the other draft had
    assert vocabulary["draft_own_tokens"] == len(own) > 0 and set(own) <= set(vocabulary["token_ids"])
    printed = capsys.readouterr().out
    assert "[prompts] 6/6 measure" in printed and "skipped" not in printed
    assert main(experiment_args(folders, out)) == 0  # a rerun skips every stage
    assert capsys.readouterr().out.count("skipped, done before") == 6


def test_a_rerun_with_other_settings_redoes_what_they_change_and_every_later_stage(folders, capsys):
    """More steps continue distillation from its checkpoint; another lr or fewer steps start it again; a measuring
    setting redoes only the measurement. Stages before the change are skipped; every later one runs again."""
    out = folders["root"] / "changed"
    args = experiment_args(folders, out)
    domain = out / "prompts"
    assert main(args) == 0
    capsys.readouterr()
    first_losses = json.loads((domain / "distill" / "report.json").read_text())["losses"]

    def rerun(*extra) -> str:
        assert main(args + list(extra)) == 0
        return capsys.readouterr().out

    printed = rerun("--steps", "5")
    assert all(f"[prompts] {stage}: skipped" in printed for stage in ("1/6 report", "2/6 transplant", "3/6 data"))
    assert ("[prompts] 4/6 distill: done before with other inputs (steps 3 -> 5); doing it and the stages after it "
            "again") in printed
    assert "4/6 distill: 5 steps (continued from step 3), loss" in printed
    assert "[prompts] 5/6 prune: " in printed and "[prompts] 6/6 measure: 6 drafts measured" in printed
    report = json.loads((domain / "distill" / "report.json").read_text())
    assert report["steps_done"] == 5 and report["losses"][:3] == first_losses
    assert aligned.find("aligned:" + aligned.name_for("other-prompts")).steps == 5

    printed = rerun("--steps", "5", "--lr", "0.01")
    assert "4/6 distill: 5 steps (started again: lr was 0.0002 there, 0.01 now)" in printed
    assert json.loads((domain / "distill" / "report.json").read_text())["losses"][0]["step"] == 1
    printed = rerun("--steps", "2", "--lr", "0.01")
    assert "4/6 distill: 2 steps (started again: it has trained 5 steps, more than the 2 asked)" in printed
    assert json.loads((domain / "distill" / "report.json").read_text())["steps_done"] == 2

    printed = rerun("--steps", "2", "--lr", "0.01", "--k", "2")
    assert printed.count("skipped, done before") == 5 and "6/6 measure: done before with other inputs (k 3 -> 2)" in printed
    assert json.loads((domain / "results.json").read_text())["k"] == 2
    assert rerun("--steps", "2", "--lr", "0.01", "--k", "2").count("skipped, done before") == 6
    printed = rerun("--steps", "2", "--lr", "0.01", "--k", "2", "--draft-dtype", "float32")  # drafts as measured
    assert printed.count("skipped, done before") == 5 and "(draft_dtype auto -> float32)" in printed
    printed = rerun("--steps", "2", "--lr", "0.01", "--k", "auto", "--draft-dtype", "float32")  # the controller
    assert printed.count("skipped, done before") == 5
    assert "6/6 measure: done before with other inputs (k 2 -> auto)" in printed
    results = json.loads((domain / "results.json").read_text())
    assert results["k"] == "auto" and all(r["identical_outputs"] == "2/2" for r in results["rows"])
    printed = rerun("--steps", "2", "--lr", "0.01", "--k", "auto", "--draft-dtype", "float32", "--dtype", "int8")
    assert printed.count("skipped, done before") == 5  # the target measured against, not the one trained from
    assert "6/6 measure: done before with other inputs (target_dtype auto -> int8)" in printed
    results = json.loads((domain / "results.json").read_text())
    assert results["dtype"] == "int8" and all(r["identical_outputs"] == "2/2" for r in results["rows"])
    (domain / "inputs.json").unlink()  # a folder whose settings are unknown is made again, from the first stage
    printed = rerun("--steps", "2", "--lr", "0.01", "--k", "2")
    assert "1/6 report: done before with other inputs (no record of its inputs)" in printed and "skipped" not in printed


def test_experiment_refuses_the_distill_only_on_policy_option(folders, capsys):
    """The recipe trains on the target's continuations only: an option it would ignore is refused, not dropped."""
    with pytest.raises(SystemExit) as refused:
        main(experiment_args(folders, folders["root"] / "on-policy") + ["--on-policy"])
    assert refused.value.code == 2 and "unrecognized arguments: --on-policy" in capsys.readouterr().err
    assert not (folders["root"] / "on-policy").exists()


def test_transplant_check_scores_both_methods(folders, capsys):
    assert main(["experiment", "transplant-check", "--target", folders["target"], "--draft", folders["other"],
                 "--prompts", folders["prompts"]]) == 0
    printed = capsys.readouterr().out
    assert "with its own tokenizer" in printed and "by string" in printed and "by index" in printed


def test_experiment_on_a_text_file_resumes_after_kills_and_skips_finished_stages(folders, capsys):
    """SIGKILL inside the transplant stage (its folder written, not yet renamed) and between distill and prune;
    each rerun finds no half-written output, skips the stages done and finishes the rest."""
    from faults import kill_at

    prompts = folders["root"] / "domain.txt"
    prompts.write_text("\n".join(["def price(option, curve):", "import QuantLib as ql", "The risk of the",
                                  "df['EBITDA_Margin'] =", "def CalcBlackScholesVega(S, K, T, r, sigma):",
                                  "return option.npv(", "The quick brown fox", "def price(", "import", "df"]) + "\n")
    out = folders["root"] / "killed"
    args = experiment_args(folders, out)
    args[args.index("--prompts") + 1] = str(prompts)
    run = f"from specdec.cli import main\nmain({args!r})\n"
    in_transplant = ("import specdec.training.align as align\noriginal = align.save_aligned\n"
                     "def save_then_pause(*args, **kwargs):\n    original(*args, **kwargs)\n    pause()\n"
                     "align.save_aligned = save_then_pause\n")
    kill_at(in_transplant + run, "pause")
    domain = out / "domain"
    assert (domain / "report.json").exists() and not (domain / "transplant").exists()
    assert [p.name[:len("transplant.partial")] for p in domain.iterdir() if "partial" in p.name] == ["transplant.partial"]
    kill_at(run, "specdec.lab.recipe.stage_prune")
    assert (domain / "transplant").is_dir() and (domain / "distill" / "draft").is_dir()
    assert not (domain / "prune").exists() and not any("partial" in p.name for p in domain.rglob("*"))
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "held out every 5th prompt, 2 of 10" in printed
    for stage in ("1/6 report", "2/6 transplant", "3/6 data", "4/6 distill"):
        assert f"[domain] {stage}: skipped, done before" in printed
    assert "[domain] 5/6 prune: " in printed and "[domain] 6/6 measure: " in printed
    assert not any("partial" in p.name for p in out.rglob("*"))
    assert set(json.loads((domain / "stage_times.json").read_text())) == {"report", "transplant", "data", "distill",
                                                                          "prune", "measure"}
    rows = json.loads((domain / "results.json").read_text())["rows"]
    assert len(rows) == 7 and all(r["identical_outputs"] == "2/2" for r in rows)
