"""Seed 001: uneven inputs with and without ``DDP.join()``, cases 1-6.

Reproduces seed 001 (PyTorch forum: "Rank 1 gets one more input than rank 0",
six cases with ``model.join()`` and ``dist.barrier()``), on gloo/CPU instead of
NCCL/GPU.  Own launcher: ``mp.spawn(worker, nprocs=2)``; MASTER_ADDR /
MASTER_PORT default to localhost:29500 (set MASTER_PORT to use another port).
``DDP(torch.nn.Linear(1, 1))``; rank r gets NUM_INPUTS + r = 5 + r inputs.

The seed's listing lost its indentation; the placement of each barrier below
follows the traces in the seed's answer (and design.md section 1):
  case 1: join(), no barrier
  case 2: no join(), no barrier
  case 3: no join(), barrier inside the loop after each backward
  case 4: join(), barrier inside the loop after each backward
  case 5: no join(), one barrier after the loop
  case 6: join() with ``model(input).sum()``, one barrier after the join block

Run:
    ddpdoctor run --launcher python examples/seed001_uneven.py --case N
    (plain: MASTER_PORT=29500 python examples/seed001_uneven.py --case N)

Observed on gloo (torch 2.13 CPU, 2 ranks; each case runs in ~3-5 s or hangs):
  case 1: both ranks finish ("Rank 0 has exhausted all 5", "Rank 1 ... 6"), exit 0.
  case 2: rank 0 finishes; rank 1's 6th backward (its gradient all-reduce has
          no partner) fails with "RuntimeError: [.../gloo/transport/tcp/pair.cc:553]
          Connection closed by peer" when rank 0 exits; mp.spawn exits 1.
  case 3: same as case 2: rank 0 finishes, rank 1 dies in its 6th backward
          with "Connection closed by peer"; exit 1.
  case 4: hang (killed after 40 s).  At seq 29 the joined rank 0 issues join's
          all-reduce (_get_num_nonjoined_procs) while rank 1 issues its 6th
          barrier, which the joined rank never shadows.  Stacks: rank 0 in the
          ``with model.join()`` exit (case4_join), rank 1 in dist.barrier()
          (case4_barrier).
  case 5: hang (killed after 40 s).  At seq 11 rank 0's barrier (after its
          5 inputs) meets rank 1's 6th gradient all-reduce; rank 1 then waits in
          a barrier that has no partner.  Stacks: rank 0 in dist.barrier()
          (case5_barrier), rank 1 in loss.backward() (case5_backward).
  case 6: both ranks finish, exit 0.

"finding" is the kind at the first position where the ranks' collectives
differ: in cases 2 and 3 rank 0 has nothing left (missing_collective); in
cases 4 and 5 rank 0 has a different op there (op_mismatch), although the
underlying problem is still a collective that one rank never issues.

Expected diagnosis (case 1):
  verdict: clean
  finding: none
  cause: none
  ranks: none
  lines: none

Expected diagnosis (case 2):
  verdict: diverged
  finding: missing_collective
  cause: uneven_inputs
  ranks: 0,1
  lines: case2_backward

Expected diagnosis (case 3):
  verdict: diverged
  finding: missing_collective
  cause: uneven_inputs
  ranks: 0,1
  lines: case3_backward

Expected diagnosis (case 4):
  verdict: diverged
  finding: op_mismatch
  cause: collective_inside_join
  ranks: 0,1
  lines: case4_barrier,case4_join

Expected diagnosis (case 5):
  verdict: diverged
  finding: op_mismatch
  cause: uneven_inputs
  ranks: 0,1
  lines: case5_backward,case5_barrier

Expected diagnosis (case 6):
  verdict: clean
  finding: none
  cause: none
  ranks: none
  lines: none
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

BACKEND = "gloo"
WORLD_SIZE = 2
NUM_INPUTS = 5


def worker(rank, case):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(BACKEND, rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 1))
    # Rank 1 gets one more input than rank 0
    inputs = [torch.tensor([1]).float() for _ in range(NUM_INPUTS + rank)]
    num_inputs = 0

    if case == 1:
        # Case 1: join() shadows rank 1's extra step -> both ranks finish.
        with model.join():  # ddpdoctor: case1_join
            for input in inputs:
                num_inputs += 1
                loss = model(input)
                loss.backward()  # ddpdoctor: case1_backward
    elif case == 2:
        # Case 2: no join(); rank 1's extra backward has no partner.
        for input in inputs:
            num_inputs += 1
            loss = model(input)
            loss.backward()  # ddpdoctor: case2_backward
    elif case == 3:
        # Case 3: no join(), barrier after every step; rank 1's extra
        # backward has no partner.
        for input in inputs:
            num_inputs += 1
            loss = model(input)
            loss.backward()  # ddpdoctor: case3_backward
            dist.barrier()  # ddpdoctor: case3_barrier
    elif case == 4:
        # Case 4: barrier inside join(); the barrier is not shadowed by the
        # joined rank and misaligns join's own all-reduces.
        with model.join():  # ddpdoctor: case4_join
            for input in inputs:
                num_inputs += 1
                loss = model(input)
                loss.backward()  # ddpdoctor: case4_backward
                dist.barrier()  # ddpdoctor: case4_barrier
    elif case == 5:
        # Case 5: no join(), barrier after the loop; rank 0's barrier meets
        # rank 1's extra gradient all-reduce.
        for input in inputs:
            num_inputs += 1
            loss = model(input)
            loss.backward()  # ddpdoctor: case5_backward
        dist.barrier()  # ddpdoctor: case5_barrier
    elif case == 6:
        # Case 6: join(), barrier after the join block -> both ranks finish.
        with model.join():  # ddpdoctor: case6_join
            for input in inputs:
                num_inputs += 1
                loss = model(input).sum()
                loss.backward()  # ddpdoctor: case6_backward
        dist.barrier()  # ddpdoctor: case6_barrier
    else:
        raise SystemExit(f"unknown case {case}")

    print(f"Rank {rank} has exhausted all {num_inputs} of its inputs!", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", type=int, choices=range(1, 7), default=1)
    args = parser.parse_args()
    mp.spawn(worker, args=(args.case,), nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main()
