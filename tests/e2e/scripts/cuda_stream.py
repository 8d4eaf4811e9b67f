"""A CUDA use that ``--cpu`` does not map (a CUDA stream), after one collective: the ranks
fail where DTensor's "cuda" device mesh fails under CPU mode."""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
dist.all_reduce(torch.ones(2, device="cuda"))
side = torch.cuda.Stream()  # ddpdoctor: unmapped
dist.destroy_process_group()
