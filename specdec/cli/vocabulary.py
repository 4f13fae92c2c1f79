"""`python -m specdec vocabulary`: the frequent-token set a draft of the target's tokenizer drafts over.

The target continues every prompt of `--prompts` (greedy); the set is every token of those prompts and
continuations, the tokenizer's first ids and every token written in the scripts they use
(`specdec.training.prune.frequent_vocabulary`). A catalogue draft drafts over the set shipped for its tokenizer
family (`assets/vocabularies/FAMILY.json`, made by this command from the suites' dev split) unless its spec says
`@vocab=all`; any model drafts over a set written here with `MODEL@vocab=FILE`.
"""
from __future__ import annotations

import shlex
from pathlib import Path

from specdec.cli.distill import read_prompts
from specdec.core.engine import autoregressive_generate
from specdec.core.suites import encode
from specdec.models.loading import add_model_arguments, load_model
from specdec.training.prune import CORE, frequent_vocabulary, save_vocabulary


def register(subparsers) -> None:
    p = subparsers.add_parser("vocabulary", help="write the frequent-token set a draft of the target's "
                                                  "tokenizer drafts over (MODEL@vocab=FILE)")
    add_model_arguments(p)
    p.add_argument("--prompts", default="all", help="prompt suite (a name or a JSON file) the target continues")
    p.add_argument("--split", default="dev", help="which of its prompts: dev (default), heldout or all")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens the target continues each prompt by")
    p.add_argument("--core", type=int, default=CORE, help="the tokenizer's first ids, kept whatever the texts")
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.set_defaults(func=run)


def run(args) -> int:
    prompts = read_prompts(args.prompts, args.split)
    if args.max_new_tokens < 1 or args.core < 0:
        raise ValueError("--max-new-tokens must be at least 1 and --core at least 0")
    target = load_model(args.target, dtype=args.dtype, quant=args.quant)
    sequences = []
    for n, prompt in enumerate(prompts, 1):
        ids = encode(prompt, target.tokenizer)
        sequences.append(ids + autoregressive_generate(target, ids, max_new_tokens=args.max_new_tokens).token_ids)
        print(f"{n}/{len(prompts)} {prompt.id}", flush=True)
    token_ids = frequent_vocabulary(target.tokenizer, sequences, core=args.core)
    path = save_vocabulary(Path(args.out), token_ids, target=target.name, prompts=args.prompts, split=args.split,
                           texts=len(sequences), tokens=sum(map(len, sequences)), core=args.core,
                           vocabulary_size=len(target.tokenizer),
                           command=shlex.join(["python", "-m", "specdec", "vocabulary", "--target", args.target,
                                               "--prompts", args.prompts, "--split", args.split, "--max-new-tokens",
                                               str(args.max_new_tokens), "--core", str(args.core)]))
    print(f"wrote {path}: {len(token_ids)} of {len(target.tokenizer)} token ids")
    return 0
