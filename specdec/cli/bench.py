"""`python -m specdec bench`: ours vs the target alone vs Hugging Face assisted generation.

Writes results.jsonl/.csv (one row per (draft, k, prompt) cell), summary.md (per-category
tables, where the time goes, k advice, performance targets, greedy divergences) and plotly HTML
charts to --out. A rerun with the same --out and settings skips the cells already measured.
`--costs FILE` (a profile another machine saved, `specdec.costs.profile`) adds a section: the speedup that
machine's costs predict from the α̂ per draft position measured here, next to the speedup measured here, and
the k the advisor picks there.
"""
from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specdec.cli.arguments import parse_k
from specdec.core import files
from specdec.core.limits import K_AUTO_START, K_MAX
from specdec.core.suites import available_suites, encode, load_suite, split_note
from specdec.core.trace import Counts, Rates
from specdec.costs.calibration import calibrate
from specdec.costs.profile import CostProfile, load_profile, speedups_by_k
from specdec.drafters import DraftSpec
from specdec.lab.bench import llamacpp
from specdec.lab.bench.run import BenchConfig, cells_to_run, contender, prompts_fingerprint, row_counts, run_bench
from specdec.lab.bench.store import check_run_folder
from specdec.lab.bench.summary import advice_rows, format_report, row_costs, summarise
from specdec.lab.measure import Calibration, calibrate_layers
from specdec.lab.plots import speedup_curves
from specdec.models.loading import add_model_arguments, load_draft, load_model

SUMMARY_MD = "summary.md"
CALIBRATION_JSON = "calibration.json"
SELF_AUTO = "self:auto"  # self-speculation with the L that calibrate_layers measures best
CALIBRATION_TOKENS = 32  # new tokens per calibration prompt (at most --max-new-tokens)
BUG_EXIT = 3  # exit status when a greedy divergence is not a rounding near-tie
LLAMA_CPP_HEADING = "\n## llama.cpp on the same GGUF files (its own target alone and speculative decoding)\n\n"


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark drafts and k against the target alone and HF assisted")
    add_model_arguments(p)
    p.add_argument("--draft", nargs="+", required=True,
                   help="one or more drafts: model specs, 'lookup' (prompt lookup), 'self:L' (first L layers) "
                        "or 'self:auto' (the L calibration measures best on the dev prompts of --prompts)")
    p.add_argument("--self-layers", nargs="+", type=int,
                   help="candidate L for self:auto (default: 1/4, 3/8, 1/2, 5/8, 3/4 of the target's depth)")
    p.add_argument("--prompts", default="all", help=f"built-in suite ({', '.join(available_suites())}), "
                                                    "a .jsonl file, or a text file with one prompt per line")
    p.add_argument("--k", nargs="+", default=["1", "2", "4", "8"], type=parse_k,
                   help=f"draft lengths to measure (1..{K_MAX}); 'auto' = the engine's adaptive k")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs are checked for identity)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per method and cell (median reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--categories", nargs="+", help="only these categories of the suite")
    p.add_argument("--split", choices=("dev", "heldout"), help="only this split of the suite")
    p.add_argument("--limit", type=int, help="first N prompts of each category")
    p.add_argument("--no-hf-generate", action="store_true", help="skip the HF plain generate() column")
    p.add_argument("--costs", metavar="FILE",
                   help="a cost profile of another machine (`profile --save FILE`): the summary adds the speedup "
                        "predicted there from the α̂ per draft position measured here, and the k to use there")
    p.add_argument("--out", required=True, help="run folder (created; reused to resume)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    profile = load_profile(args.costs) if args.costs else None
    prompts = load_suite(args.prompts, split=args.split, categories=args.categories, limit=args.limit)
    note = split_note(args.prompts) if args.split else None
    if note:
        print(note, flush=True)
    target = load_model(args.target, dtype=args.dtype, quant=args.quant)
    if profile is not None:
        profile.check_target(target.name)
    out = Path(args.out)
    config = BenchConfig(target=args.target, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         repeats=args.repeats, seed=args.seed, dtype=target.dtype)
    check_run_folder(out, replace(config, prompts=prompts_fingerprint(prompts)))  # before anything is written
    calibration = calibrate_self_auto(target, args, out) if SELF_AUTO in args.draft else None
    specs = [f"self:{calibration.best_layers}" if spec == SELF_AUTO else spec for spec in args.draft]
    for spec in specs if profile is not None else ():
        profile.costs(spec)  # every draft priced there, before the cells run
    contenders = [calibrated(spec, load_draft(spec, target, dtype=args.draft_dtype), target) for spec in specs]
    print(f"target {target.name} ({target.dtype}); drafts {', '.join(c.name for c in contenders)}; "
          f"{len(prompts)} prompts x k {args.k}; HF assisted for: "
          f"{', '.join(c.name for c in contenders if c.hf_assistant is not None) or 'none'}")
    rows = bench_with_progress(target, contenders, prompts, args.k, config, out, hf_plain=not args.no_hf_generate)
    report = (calibration_text(calibration) if calibration else "") + format_report(rows)
    report += llama_cpp_section(args, target, prompts, out, rows)
    report += profile_section(rows, profile) if profile is not None else ""
    files.write_text(out / SUMMARY_MD, report)
    charts = write_charts(rows, out)
    print(report)
    print(f"wrote {out / 'results.csv'}, {out / 'results.jsonl'}, {out / SUMMARY_MD}, "
          + ", ".join(str(c) for c in charts))
    bugs = [r for r in rows if (r.get("divergence") or {}).get("near_tie") is False]
    for row in bugs:
        print(f"error: greedy output left the target's and rounding does not explain it ({row['draft']}, "
              f"k={row['k']}, {row['prompt_id']}): {row['divergence']['describe']}", file=sys.stderr)
    return BUG_EXIT if bugs else 0


def llama_cpp_section(args, target, prompts, out: Path, rows: list[dict]) -> str:
    """llama.cpp on the same GGUF files and prompts, when its binaries are there (`specdec.lab.bench.llamacpp`),
    beside our tokens/s of each (draft, k, prompt) in `rows`."""
    binaries = llamacpp.find_binaries()
    if binaries is None:
        return ""
    with contextlib.ExitStack() as held:  # the GGUF files stay in the cache while llama.cpp reads them
        target_gguf = llamacpp.gguf_of(args.target, held)
        models = {spec: DraftSpec.parse(spec) for spec in args.draft}
        drafts = {spec: llamacpp.gguf_of(parsed.model, held) for spec, parsed in models.items()
                  if parsed.kind == "model"}
        drafts = {spec: path for spec, path in drafts.items() if path is not None}
        if target_gguf is None:
            return ""
        threads = torch.get_num_threads()
        try:
            alone = llamacpp.target_alone_tok_s(binaries, target_gguf, args.max_new_tokens, threads)
        except ValueError as error:  # an optional column: the report keeps the rest
            return f"{LLAMA_CPP_HEADING}{_first_line(error)}\n"
        runs, failed = [], []
        ours = {(r["draft"], r["k"], r["prompt_id"]): r["ours_tok_s"] for r in rows}
        for prompt in prompts:
            text = target.tokenizer.decode(encode(prompt, target.tokenizer))
            for spec, draft_gguf in drafts.items():
                for k in sorted({K_AUTO_START if k == "auto" else k for k in args.k}):
                    try:
                        tok_s, accept, repacked = llamacpp.speculative(binaries, target_gguf, draft_gguf, text,
                                                                       args.max_new_tokens, k, threads)
                    except ValueError as error:
                        failed.append(f"- {spec} k={k} {prompt.id}: {_first_line(error)}")
                        continue
                    ours_tok_s = ours.get((spec, "auto", prompt.id), ours.get((spec, k, prompt.id)))
                    runs.append(llamacpp.LlamaCppRun(spec, k, prompt.id, alone, tok_s, accept, repacked, ours_tok_s))
                    print(f"llama.cpp {spec} k={k} {prompt.id}: {tok_s:.2f} tok/s ({runs[-1].speedup:.2f}x its "
                          f"target alone, {alone:.2f} tok/s)", flush=True)
    files.write_text(out / "llama_cpp.json", json.dumps([asdict(r) for r in runs], indent=1))
    parts = [f"Its target alone: {alone:.2f} tokens/s."] + ([llamacpp.markdown(runs)] if runs else []) \
        + (["Its speculative runs that failed:\n" + "\n".join(failed)] if failed else [])
    return LLAMA_CPP_HEADING + "\n\n".join(parts) + "\n"


def _first_line(error: Exception) -> str:
    """An error's message as one line (a binary's stderr tail can span several)."""
    return " ".join(str(error).split())[:300]


def profile_section(rows: list[dict], profile: CostProfile) -> str:
    """Markdown: per draft and fixed k, the speedup predicted on the profiled machine from the α̂ per position
    measured here (the cells' counts pooled), next to the speedup predicted and measured here; then the k the
    advisor picks there, from the cells of the largest fixed k (whose positions reach furthest)."""
    lines = [f"## On {profile.label} (cost profile {profile.source}, measured {profile.date})", "",
             "| draft | k | measured here | predicted here | predicted there |", "|---|---|---|---|---|"]
    advice = []
    overall = {(s.draft, s.k): s for s in summarise(rows) if s.category == "all"}
    for draft in sorted({r["draft"] for r in rows} & set(profile.drafts)):
        costs = profile.costs(draft)
        ks = sorted({int(r["k"]) for r in rows if r["draft"] == draft and str(r["k"]).isdigit()})
        there = {k: speedups_by_k(_position_rates(rows, draft, k), costs) for k in ks}
        for k in ks:
            here = overall[(draft, str(k))]
            lines.append(f"| {draft} | {k} | {here.speedup_vs_target_alone:.2f}x | {here.predicted_speedup:.2f}x | "
                         f"{there[k][k]:.2f}x |")
        if ks:
            widest = there[ks[-1]]
            best = max(range(1, len(widest)), key=lambda k: (widest[k], -k))
            advice.append(f"- {draft}: use k={best} there (predicted {widest[best]:.2f}x; from the α̂ per position of "
                          f"the k={ks[-1]} cells)")
    return "\n" + "\n".join(lines + [""] + advice) + "\n"


def _position_rates(rows: list[dict], draft: str, k: int) -> list[float]:
    """The conditional acceptance per draft position of `draft`'s cells at k, their counts pooled."""
    counts = sum((row_counts(r) for r in rows if r["draft"] == draft and r["k"] == str(k)), Counts())
    return Rates.of(counts, k).per_position_acceptance


def calibrated(spec: str, draft, target):
    """A contender with its pair's measured costs (v(n), c; cached per machine, `specdec.costs.calibration`)."""
    costs = calibrate(target, draft)
    print(f"costs of {spec}: v(2..{len(costs.target.verify)}) = "
          + " ".join(f"{v:.2f}" for v in costs.target.verify[1:]) + f", c = {costs.draft_cost:.3f}"
          + ("" if costs.measured_now else " (cached)"), flush=True)
    return contender(spec, draft, target, costs)


def calibrate_self_auto(target, args, out: Path) -> Calibration:
    """Choose L for self:auto: `calibrate_layers` on the first dev prompt of each category.

    Calibration k = the first fixed --k (K_AUTO_START when only 'auto'); greedy, at most
    CALIBRATION_TOKENS new tokens. Measure on --split heldout to keep calibration and report apart.
    Stored in calibration.json and reused by a rerun with the same settings.
    """
    prompts = load_suite(args.prompts, split="dev", categories=args.categories, limit=1)
    settings = {"target": target.name, "dtype": target.dtype, "prompts": [p.id for p in prompts],
                "k": next((k for k in args.k if k != "auto"), K_AUTO_START), "candidates": args.self_layers,
                "max_new_tokens": min(args.max_new_tokens, CALIBRATION_TOKENS)}
    path = out / CALIBRATION_JSON
    stored = json.loads(path.read_text()) if path.exists() else {}
    if stored.get("settings") == settings:
        return Calibration.from_dict(stored)
    print(f"self:auto: calibrating L on {len(prompts)} dev prompts (k={settings['k']}) ...", flush=True)
    calibration = calibrate_layers(target, [encode(p, target.tokenizer) for p in prompts], k=settings["k"],
                                   candidates=args.self_layers, max_new_tokens=settings["max_new_tokens"],
                                   on_layer=print_layer)
    files.write_text(path, json.dumps({"settings": settings, **calibration.to_dict()}, indent=1))
    print(calibration_text(calibration), flush=True)
    return calibration


def print_layer(layers: int, m) -> None:
    print(f"  self:{layers}: α̂={m.acceptance_rate:.3f} c={m.cost_ratio:.2f} Leviathan bound {m.leviathan_bound:.2f}x, "
          f"measured {m.measured_speedup:.2f}x",
          flush=True)


def calibration_text(calibration: Calibration) -> str:
    """Markdown: alpha-hat, c, Leviathan's bound and the measured speedup per candidate L."""
    lines = ["## self:auto calibration (dev prompts)", "",
             "| L | α̂ | c | Leviathan bound | measured speedup |", "|---|---|---|---|---|"]
    lines += [f"| {layers}{' (chosen)' if layers == calibration.best_layers else ''} | {m.acceptance_rate:.3f} | "
              f"{m.cost_ratio:.2f} | {m.leviathan_bound:.2f}x | {m.measured_speedup:.2f}x |" for layers, m in calibration.results]
    if calibration.best.leviathan_bound <= 1.0:
        lines += ["", f"No candidate L has a Leviathan bound above 1x (best {calibration.best.leviathan_bound:.2f}x): "
                      "self-speculation cannot beat the target alone on these prompts; the L benched is the "
                      "cheapest loser. An early exit pays only when the target was trained for it (LayerSkip)."]
    return "\n".join(lines) + "\n\n"


def bench_with_progress(target, contenders, prompts, ks, config, out: Path, **options) -> list[dict]:
    """run_bench with a tqdm bar on stderr and one line per finished cell."""
    from tqdm import tqdm

    total = cells_to_run(out, contenders, prompts, ks)
    with tqdm(total=total, desc="cells", file=sys.stderr, dynamic_ncols=True) as bar:
        def on_cell(row: dict) -> None:
            bar.write(cell_line(row))
            bar.update(1)
        return run_bench(target, contenders, prompts, ks, config, out, on_cell=on_cell, **options)


def cell_line(row: dict) -> str:
    hf = row["speedup_vs_hf_assisted"]
    divergence = (row.get("divergence") or {}).get("describe", f"at token {row['first_divergence']}")
    same = {True: "identical", False: f"DIVERGES: {divergence}", None: "sampled"}
    return (f"{row['draft']} k={row['k']} {row['prompt_id']}: α̂={row['acceptance_rate']:.2f} "
            f"c={row['cost_ratio']:.2f} v={row['verify_cost']:.2f} {row['ours_tok_s']:.2f} tok/s, "
            f"{row['speedup_vs_target_alone']:.2f}x vs target alone (predicted {row['predicted_speedup']:.2f}x, "
            f"Leviathan bound {row['leviathan_bound']:.2f}x)"
            + (f", {hf:.2f}x vs HF assisted" if hf is not None else "")
            + f", {same[row['ours_equals_target_alone']]}")


def write_charts(rows: list[dict], out: Path) -> list[Path]:
    """speedup_vs_k.html and categories.html, drawn with the dashboard's own figure builder (plotly is
    imported here only: specdec's core never does)."""
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs
    from plotly.subplots import make_subplots

    summaries = summarise(rows)
    drafts = sorted({s.draft for s in summaries})
    pooled = {a.draft: a for a in advice_rows(rows, summaries) if a.category == "all"}  # α̂ and c over every fixed k
    figure = make_subplots(rows=1, cols=len(drafts), subplot_titles=drafts, shared_yaxes=True)
    for col, draft in enumerate(drafts, start=1):
        overall = [s for s in summaries if s.draft == draft and s.category == "all"]
        costs = next((row_costs(r) for r in rows if r["draft"] == draft), None)
        for trace in _speedup_traces(overall, pooled.get(draft), costs):
            trace.showlegend = col == 1
            figure.add_trace(trace, row=1, col=col)
        figure.update_xaxes(title_text="k (draft tokens per round)", row=1, col=col)
    figure.update_yaxes(title_text="speedup vs target alone", row=1, col=1)
    figure.update_layout(title="Measured speedup vs k, next to Leviathan's bound and the prediction (all prompts)")
    bars = go.Figure([_category_bars(summaries, draft) for draft in drafts])
    bars.update_layout(title="Measured speedup per category at each draft's best k (all prompts)",
                       yaxis_title="speedup vs target alone", barmode="group")
    paths = [out / "speedup_vs_k.html", out / "categories.html"]
    files.write_text(out / "plotly.min.js", get_plotlyjs())  # what both load; plotly's write_html writes it in
    for path, chart in zip(paths, (figure, bars)):  # place, and never again once there: a kill left it cut for good
        files.write_text(path, chart.to_html(include_plotlyjs="directory"))
    return paths


def _speedup_traces(summaries: list, pooled, costs) -> list:
    """The dashboard's theory-vs-measurement traces at the pooled α̂ and c (`pooled`: the draft's AdviceRow
    over every fixed k, None when no fixed k was measured) and the calibrated v(n), plus HF assisted."""
    import plotly.graph_objects as go


    fixed = sorted((s for s in summaries if s.k.isdigit()), key=lambda s: int(s.k))
    if not fixed or pooled is None:
        return []
    measured = [(int(s.k), s.speedup_vs_target_alone) for s in fixed]
    slope, curve = (costs.verify_slope(), costs.target.verify) if costs else (0.0, None)
    traces = list(speedup_curves(pooled.acceptance_rate, pooled.cost_ratio, max(k for k, _ in measured), measured,
                                 slope, curve).data)
    hf = [(int(s.k), s.hf_assisted_tok_s / s.target_alone_tok_s) for s in fixed if s.hf_assisted_tok_s]
    if hf:
        traces.append(go.Scatter(x=[k for k, _ in hf], y=[v for _, v in hf], mode="lines+markers",
                                 name="HF assisted (measured)"))
    return traces


def _category_bars(summaries: list, draft: str):
    import plotly.graph_objects as go

    best_k = max((s for s in summaries if s.draft == draft and s.category == "all"),
                 key=lambda s: s.speedup_vs_target_alone).k
    chosen = [s for s in summaries if s.draft == draft and s.k == best_k]
    return go.Bar(x=[s.category for s in chosen], y=[s.speedup_vs_target_alone for s in chosen],
                  name=f"{draft} (k={best_k})",
                  customdata=[[s.acceptance_rate, s.leviathan_bound] for s in chosen],
                  hovertemplate="%{x}: %{y:.2f}x<br>α̂=%{customdata[0]:.2f}, bound %{customdata[1]:.2f}x")
