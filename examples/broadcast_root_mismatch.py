"""Broadcast whose ``src`` is computed from a rank-local value.

"The rank with the best validation loss shares its weights": each rank puts
its own loss in a vector of ``inf`` and takes the argmin, but the losses are
never all-gathered, so every rank picks itself and calls
``dist.broadcast(weights, src=<own rank>)``.  The ranks disagree on the root
of the same collective.  Cause id: ``broadcast_root_mismatch``.  Fix: compute
``src`` from values every rank agrees on (all_gather the losses first, or a
fixed rank).

Run:
    ddpdoctor run examples/broadcast_root_mismatch.py
    (plain: torchrun --nproc-per-node 2 examples/broadcast_root_mismatch.py)

Collectives (torch 2.13, gloo): seq 1 broadcast float32[8] on both ranks,
src 0 on rank 0 and src 1 on rank 1.

Observed on gloo (torch 2.13 CPU, 2 ranks): hangs after ~1 s and never
finishes (killed after 40 s), no error message; both ranks are blocked in
``dist.broadcast`` at marker broadcast_best.

Expected diagnosis:
  verdict: diverged
  finding: root_mismatch
  cause: broadcast_root_mismatch
  ranks: 0,1
  lines: broadcast_best
"""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(rank)  # each rank starts from different weights

    weights = torch.randn(8)
    val_loss = float(1.0 + rank)

    # "The rank with the best validation loss shares its weights."
    # BUG: the losses are never gathered, so every rank only knows its own
    # loss and picks itself as the source of the broadcast.
    losses = torch.full((world_size,), float("inf"))
    losses[rank] = val_loss
    best = int(torch.argmin(losses))
    dist.broadcast(weights, src=best)  # ddpdoctor: broadcast_best

    # The ranks now silently hold different weights.
    print(f"rank {rank}: broadcast from src={best}, weights[0]={weights[0].item():.4f}", flush=True)

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
