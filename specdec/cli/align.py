"""`python -m specdec align`: hard-clone the target's tokenizer into a draft (embedding transplant)."""
from __future__ import annotations

from specdec.core.inputs import vocab_size
from specdec.models import aligned
from specdec.models.loading import add_model_arguments, load_model
from specdec.training.align import save_aligned, transplant_vocabulary


def register(subparsers) -> None:
    p = subparsers.add_parser("align", help="give a draft the target's tokenizer (embedding transplant)")
    add_model_arguments(p)
    p.add_argument("--draft", required=True, help="draft model (catalogue name, folder, .gguf, hub id)")
    p.add_argument("--out", required=True, help="folder for the aligned draft (safetensors + target tokenizer)")
    p.add_argument("--method", choices=("string", "index"), default="string",
                   help="string: copy rows by token string, new tokens = mean of their pieces (default); "
                        "index: the naive copy of the first rows by number, noise for the rest")
    p.add_argument("--name", help="name it is registered under in the model cache, loadable as aligned:NAME "
                                  "(default: the --out folder's name)")
    p.set_defaults(func=run)


def run(args) -> int:
    target = load_model(args.target, dtype=args.dtype, role="train")
    draft = load_model(args.draft, dtype=args.dtype, role="train")
    rows = vocab_size(target.model)
    summary = transplant_vocabulary(draft.model, draft.tokenizer, target.tokenizer, method=args.method, rows=rows)
    out = save_aligned(draft.model, target.tokenizer, args.out, summary)
    print(f"aligned {draft.name} to {target.name}'s tokenizer ({summary.method}): {summary.rows} rows, "
          f"{summary.copied} copied, {summary.from_pieces} from pieces, {summary.initialised} initialised"
          f"{', tied' if summary.tied else ''}\nsaved to {out}")
    print(vllm_hint(target.name, str(out), rows, vocab_size(draft.model)))
    card = aligned.Card(name=aligned.name_for(args.name or out.resolve().name), target=aligned.loaded_id(target),
                        source=aligned.loaded_id(draft), method="transplant")
    print(f"registered as {card.spec} in {aligned.register(out, card)}")
    return 0


def vllm_hint(target: str, draft_folder: str, target_rows: int, draft_rows: int) -> str:
    """How to serve the pair with vLLM; a warning when the logit widths differ (vLLM requires equality)."""
    hint = ("serve with vLLM:\n"
            f"  vllm serve {target} --speculative-config "
            f"'{{\"model\": \"{draft_folder}\", \"num_speculative_tokens\": 4}}'")
    if target_rows != draft_rows:
        hint += (f"\nwarning: the target has {target_rows} logit rows, the draft {draft_rows}; vLLM and llama.cpp "
                 "refuse any difference (vLLM #7252, llama.cpp #3812): re-run align with the target's row count")
    return hint
