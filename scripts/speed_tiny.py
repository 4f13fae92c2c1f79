"""Run from the repo root: `python scripts/speed_tiny.py`.

Tokens/s of HF generate() vs our autoregressive_generate (the honest baseline) on a tiny in-code llama,
and of HF assisted generation vs speculative_generate with an unrelated 1-layer draft (the bench sets
HF's draft config properly; use `python -m specdec bench` for that comparison).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import time, torch
torch.set_num_threads(1)
from specdec import autoregressive_generate, speculative_generate
from specdec.testing import tiny_model, perturbed_copy
t = tiny_model("llama", seed=0, layers=4, hidden=256, vocab_size=32000, context=1024)
d = tiny_model("llama", seed=0, layers=1, hidden=256, vocab_size=32000, context=1024)
prompt = torch.tensor([[1,5,9,33,17,60,4]*4])
N=128
def best(f, r=3):
    ts=[]
    for _ in range(r):
        s=time.perf_counter(); out=f(); ts.append(time.perf_counter()-s)
    return min(ts), out
hf_t, hf = best(lambda: t.generate(prompt, do_sample=False, max_new_tokens=N, min_new_tokens=N, pad_token_id=0))
ar_t, ar = best(lambda: autoregressive_generate(t, prompt, max_new_tokens=N, eos_token_id=[]))
print(f"HF generate {N/hf_t:.1f} tok/s   ours AR {N/ar_t:.1f} tok/s  ratio {hf_t/ar_t:.2f}  same={hf[0,prompt.shape[1]:].tolist()==ar.token_ids}")
for k in [2,4]:
    a_t, a = best(lambda: t.generate(prompt, assistant_model=d, do_sample=False, max_new_tokens=N, min_new_tokens=N, pad_token_id=0, num_assistant_tokens=k, num_assistant_tokens_schedule="constant"))
    s_t, s = best(lambda: speculative_generate(t, d, prompt, k=k, max_new_tokens=N, eos_token_id=[]))
    print(f"k={k} HF assisted {N/a_t:.1f} tok/s  ours {N/s_t:.1f} tok/s ratio {a_t/s_t:.2f} alpha {s.stats.acceptance_rate:.2f}")
