import torch

# Tiny test models gain nothing from intra-op threads, and one thread keeps timings steady on 2 cores.
# Tests that load real models raise this themselves.
torch.set_num_threads(1)
