"""all_reduce of a tensor whose length depends on the rank.

Each rank scored a different number of validation samples (4 - rank) and
all-reduces the per-sample tensor directly.  all_reduce needs the same shape
on every rank; here rank 0 passes float32[4] and rank 1 float32[3].
Cause id: ``rank_dependent_shape``.  Fix: all-reduce a fixed-size summary
(e.g. ``[sum, count]``) or pad and use ``all_gather``.

Run:
    ddpdoctor run examples/rank_dependent_shape.py
    (plain: torchrun --nproc-per-node 2 examples/rank_dependent_shape.py)

Collectives (torch 2.13, gloo): seq 1 all_reduce float32[1] (the count)
matches; seq 2 all_reduce float32[4] on rank 0 vs float32[3] on rank 1.

Observed on gloo (torch 2.13 CPU, 2 ranks, ~3 s): no shape check at all.
Rank 1 (the shorter tensor) completes the all_reduce with wrong data, prints
its (wrong) mean "over 7 samples" and "rank 1 done" (torchrun then reports it
as exit 0 or, in 3 of 4 runs, SIGTERM during teardown); rank 0 stays blocked
in the all_reduce (marker shape_allreduce) and fails with ``RuntimeError:
[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer`` once rank 1
has gone; torchrun exits 1.

Expected diagnosis:
  verdict: diverged
  finding: shape_mismatch
  cause: rank_dependent_shape
  ranks: 0,1
  lines: shape_allreduce
"""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    # Each rank scored a different number of validation samples (the last
    # shard is one sample short, as with an unpadded sampler).
    num_local = 4 - rank
    scores = torch.rand(num_local)

    # A healthy collective first: a fixed-size tensor.
    count = torch.tensor([float(num_local)])
    dist.all_reduce(count)

    # BUG: the per-sample tensor's length depends on the rank; all_reduce
    # needs the same shape everywhere (use all_gather with padding, or reduce
    # a fixed-size summary such as [sum, count]).
    dist.all_reduce(scores)  # ddpdoctor: shape_allreduce
    mean = scores.sum() / count
    print(f"rank {rank}: mean score {mean.item():.4f} over {int(count.item())} samples ({world_size} ranks)", flush=True)

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
