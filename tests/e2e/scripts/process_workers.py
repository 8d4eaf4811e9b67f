"""Two workers started with ``multiprocessing.Process`` (the pattern of PyTorch's "Writing
Distributed Applications" tutorial), ``--steps`` all-reduces each; ``--rank0-barrier``: rank 0
alone then calls ``barrier()``."""

import argparse
import multiprocessing
import os

import torch
import torch.distributed as dist


def worker(rank: int, world: int, port: int, steps: int, rank0_barrier: bool) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(4)
    for _ in range(steps):
        dist.all_reduce(t)
    if rank0_barrier and rank == 0:
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-method", default="fork")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rank0-barrier", action="store_true")
    args = parser.parse_args()
    context = multiprocessing.get_context(args.start_method)
    workers = [context.Process(target=worker, args=(r, 2, args.port, args.steps,
                                                            args.rank0_barrier))
               for r in range(2)]
    for p in workers:
        p.start()
    for p in workers:
        p.join()
    raise SystemExit(max(abs(p.exitcode or 0) for p in workers))
