"""Two process groups used in a rank-dependent order (wait-for cycle).

Two groups over the same ranks (``grad_group`` and ``metric_group``, both
``new_group([0, 1])``).  Three healthy steps use them in the same order on
every rank; then rank 0 all-reduces on grad_group first while rank 1
all-reduces on metric_group first.  Each group on its own is consistent (the
same ops, shapes and counts on both ranks), but rank 0 waits for rank 1 in
grad_group while rank 1 waits for rank 0 in metric_group: a wait-for cycle
across groups.  Cause id: ``group_order_inversion``.  Fix: issue collectives
on different groups in one global order on every rank.

Run:
    ddpdoctor run examples/group_order_inversion.py
    (plain: torchrun --nproc-per-node 2 examples/group_order_inversion.py)

Collectives (torch 2.13, gloo): grad_group is pg 1 (float32[16]),
metric_group is pg 2 (float32[2]); seq 1-3 on each group match.  Seq 4:
rank 0 is blocked in pg 1, rank 1 in pg 2.

Observed on gloo (torch 2.13 CPU, 2 ranks): hangs after ~1 s and never
finishes (killed after 40 s), no error message.  Stacks: rank 0 in the
all_reduce at marker rank0_first, rank 1 in the all_reduce at marker
rank1_first.  On NCCL: hang.

Expected diagnosis:
  verdict: diverged
  finding: wait_cycle
  cause: group_order_inversion
  ranks: 0,1
  lines: rank0_first,rank1_first
"""
import torch
import torch.distributed as dist

STEPS = 3


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    # Two groups over the same ranks, e.g. one for gradients, one for metrics.
    grad_group = dist.new_group([0, 1])
    metric_group = dist.new_group([0, 1])

    grads = torch.randn(16)
    metrics = torch.tensor([float(rank), 1.0])

    # A few healthy steps: same order on every rank.
    for _ in range(STEPS):
        dist.all_reduce(grads, group=grad_group)
        dist.all_reduce(metrics, group=metric_group)

    # BUG: the order of the two groups depends on the rank.
    if rank == 0:
        dist.all_reduce(grads, group=grad_group)  # ddpdoctor: rank0_first
        dist.all_reduce(metrics, group=metric_group)  # ddpdoctor: rank0_second
    else:
        dist.all_reduce(metrics, group=metric_group)  # ddpdoctor: rank1_first
        dist.all_reduce(grads, group=grad_group)  # ddpdoctor: rank1_second

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
