"""Mixture-of-experts token dispatch with output split sizes the peers never agreed to.

Each rank hosts one expert.  A router sends each token to an expert, so every rank sends a
data-dependent number of tokens to every other rank with ``all_to_all_single``: its input
split sizes are its local routing counts.  BUG: the output split sizes must be what each
*peer* sends here, but this code reuses the local counts (``output_splits = input_splits``),
which only holds when routing happens to be symmetric.
Cause id: ``rank_dependent_split_sizes``.  Fix: exchange the counts first
(``dist.all_to_all_single(recv_counts, send_counts)``) and pass ``recv_counts`` as the output
split sizes.

Run:
    ddpdoctor run examples/moe_split_mismatch.py
    (plain: torchrun --nproc-per-node 2 examples/moe_split_mismatch.py)

Collectives (torch 2.13, gloo): per step an all_reduce of the load-balancing statistics,
then the dispatch all_to_all_single.  In step 0 rank 0 routes 4 tokens to rank 1 but rank 1
expects 5 (its own count for rank 0), and rank 1 routes 5 to rank 0, which expects 4.

Observed on gloo (torch 2.13 CPU, 2 ranks, ~3 s): rank 0, sent more than it expects, aborts
(SIGABRT) with ``terminate called after throwing an instance of 'gloo::EnforceNotMet' ...
op.preamble.length <= op.nbytes. 160 vs 128. Received data size doesn't match expected
size``; rank 1 fails with "Connection reset by peer"; torchrun reports only "exitcode: -6".

Expected diagnosis:
  verdict: diverged
  finding: split_mismatch
  cause: rank_dependent_split_sizes
  ranks: 0,1
  lines: dispatch
"""
import torch
import torch.distributed as dist


def route(tokens, router, world_size):
    """Each token's expert (one expert per rank), and the tokens sorted by expert."""
    expert = router(tokens).argmax(dim=1) % world_size
    order = expert.argsort()
    counts = torch.bincount(expert, minlength=world_size)
    return tokens[order], counts.tolist()


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    router = torch.nn.Linear(8, 4)  # the same router everywhere (same seed)
    torch.manual_seed(rank)
    for step in range(3):
        tokens = torch.randn(8, 8)  # each rank's own batch
        dispatched, input_splits = route(tokens, router, world_size)
        load = torch.tensor(input_splits, dtype=torch.float32)
        dist.all_reduce(load)  # load-balancing statistics (healthy)
        # BUG: what this rank receives from each peer is the peer's count, not its own.
        output_splits = input_splits
        received = torch.empty(sum(output_splits), 8)
        dist.all_to_all_single(received, dispatched, output_splits, input_splits)  # ddpdoctor: dispatch
        print(f"rank {rank} step {step}: sent {input_splits}, received {received.shape[0]} tokens", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
