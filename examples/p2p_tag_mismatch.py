"""Two-stage pipeline whose stages tag their messages differently.

Rank 0 runs the first half of the model and sends the activations of each micro-batch to
rank 1 with ``tag=micro_batch``; rank 1 receives them with ``tag=stage`` (its own stage
number, 1).  A receive only matches a send from the same peer *with the same tag*: the
first micro-batch (sent with tag 0) never arrives.
Cause id: ``p2p_tag_mismatch``.  Fix: derive the tag from a value both sides share (the
micro-batch index), or leave the default tag 0 and rely on the order of the messages.

Run:
    ddpdoctor run --hang-timeout 10 examples/p2p_tag_mismatch.py
    (plain: torchrun --nproc-per-node 2 examples/p2p_tag_mismatch.py)

Collectives (torch 2.13, gloo): a barrier, then rank 0 sends micro-batch 0 with tag 0 and
rank 1 waits in a recv from rank 0 with tag 1.

Observed on gloo (torch 2.13 CPU, 2 ranks): both ranks block (the unmatched send waits for
a receive as well) until the process group timeout (30 minutes by default); no error names
the tags.

Expected diagnosis:
  verdict: diverged
  finding: tag_mismatch
  cause: p2p_tag_mismatch
  ranks: 0,1
  lines: send,recv
"""
import torch
import torch.distributed as dist

STAGE = {0: 0, 1: 1}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    first, second = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
    dist.barrier()
    for micro_batch in range(4):
        if rank == 0:
            activations = first(torch.randn(2, 16)).detach()
            dist.send(activations, dst=1, tag=micro_batch)  # ddpdoctor: send
        else:
            activations = torch.empty(2, 16)
            # BUG: the sender tags by micro-batch, this side by its stage number.
            dist.recv(activations, src=0, tag=STAGE[rank])  # ddpdoctor: recv
            print(f"micro-batch {micro_batch}: output {second(activations).sum().item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
