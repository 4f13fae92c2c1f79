"""Run from the repo root: `python scripts/forward_rows.py`.

Whole-model forward time of the 1.5B target (fp32, 2 threads) for 1/2/5 new tokens after a prompt, levers on/off."""
import os
import time
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
torch.set_num_threads(2)
from specdec.kv import CachedLM
from specdec.models import load_model

m = load_model("qwen2.5-coder-1.5b-instruct", dtype="float32")
prompt = m.tokenizer("def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[0]\n")["input_ids"]
lm = CachedLM(m.model)
lm.forward(prompt)
for n in (1, 2, 5):
    times = []
    for _ in range(5):
        _, seconds = lm.forward([100] * n, logits_to_keep=n)
        lm.pending(prompt + [0])  # roll back to the prompt (+1 pending) by the rollback rule
        times.append(seconds)
    print(f"levers={os.environ.get('LEVERS', 'on')} {n} new tokens: median {sorted(times)[2] * 1000:.0f} ms", flush=True)
