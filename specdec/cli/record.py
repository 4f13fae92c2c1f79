"""`python -m specdec record`: each of the app's prompt presets run with its default pair and settings, and the
target alone, written as `assets/recordings/<preset slug>.json` (`specdec.lab.recording`): the app's Live tab
shows one at once, before any model loads, labelled with the machine and date it was measured on."""
from __future__ import annotations

from specdec.cli.arguments import parse_k
from specdec.core.limits import K_MAX
from specdec.core.trace import measured_speedup
from specdec.costs.calibration import calibrate
from specdec.lab import presets, recording
from specdec.models import entries
from specdec.models.loading import add_model_arguments, load_draft, load_model


def register(subparsers) -> None:
    p = subparsers.add_parser("record", help="record the app's prompt presets: the Live tab's first look")
    add_model_arguments(p, target_default=entries.default_name("target"))
    p.add_argument("--draft", default=presets.live_draft(entries.default_name("draft")),
                   help="draft model (catalogue name, folder, .gguf, hub id) or drafter (default: the app's)")
    p.add_argument("--preset", help=f"one preset (default: every one): {', '.join(repr(n) for n in presets.PROMPTS)}")
    p.add_argument("--k", type=parse_k, default=presets.LIVE_K,
                   help=f"draft tokens per round (1..{K_MAX}), or auto (default: {presets.LIVE_K}, as the app)")
    p.add_argument("--max-new-tokens", type=int, default=presets.LIVE_MAX_NEW_TOKENS,
                   help=f"new tokens at most (default: {presets.LIVE_MAX_NEW_TOKENS}, as the app)")
    p.add_argument("--out", default=str(recording.FOLDER), help="folder to write to (default: %(default)s)")
    p.set_defaults(func=run)


def run(args) -> int:
    names = list(presets.PROMPTS) if args.preset is None else [args.preset]
    for name in names:
        presets.preset(name)  # a bad name is refused before any model loads
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens takes a positive number of tokens, got {args.max_new_tokens}")
    target = load_model(args.target, dtype=args.dtype, quant=args.quant)
    loaded = []  # the draft's model, when it has one
    draft = load_draft(args.draft, target, dtype=args.draft_dtype,
                       load=lambda spec, **options: loaded.append(load_model(spec, **options)) or loaded[-1])
    formats = {model.name: model.dtype for model in (target, *loaded)}
    costs = calibrate(target, draft)
    for name in names:
        made = recording.record(target, draft, args.draft, name, args.k, args.max_new_tokens, costs, formats)
        path = recording.save_recording(made, args.out)
        speedup = measured_speedup(made.result.stats, made.baseline.stats)
        print(f"{name}: {len(made.result.token_ids)} tokens in {len(made.result.rounds)} rounds, "
              f"{made.result.stats.tokens_per_s:.2f} tokens/s vs {made.baseline.stats.tokens_per_s:.2f} alone "
              f"({speedup:.2f}x) -> {path}")
    return 0
