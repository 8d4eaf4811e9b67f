"""Every kind of collective and point-to-point op gloo supports, once, on 2 ranks
(``--no-all-to-all``: but the list ``all_to_all``, which torch 2.6's gloo refuses)."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(4)
dist.all_reduce(t)
dist.broadcast(t, src=1)
dist.reduce(t, dst=0)
dist.all_gather([torch.empty(4) for _ in range(world)], t)
dist.all_gather_into_tensor(torch.empty(4 * world), t)
dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world))
with dist._coalescing_manager():  # FSDP2's coalesced ops: gloo binds them in C++ only
    dist.all_gather_into_tensor(torch.empty(4 * world), t)
    dist.all_gather_into_tensor(torch.empty(2 * world), torch.ones(2))
with dist._coalescing_manager():
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world))
    dist.reduce_scatter_tensor(torch.empty(1), torch.ones(world))
dist.all_to_all_single(torch.empty(4), torch.ones(4))
if "--no-all-to-all" not in sys.argv:
    dist.all_to_all([torch.empty(2) for _ in range(world)], [torch.ones(2) for _ in range(world)])
dist.gather(t, [torch.empty(4) for _ in range(world)] if rank == 0 else None, dst=0)
dist.scatter(torch.empty(4), [torch.ones(4) for _ in range(world)] if rank == 0 else None, src=0)
dist.barrier()
if rank == 0:
    dist.send(torch.ones(3), dst=1, tag=5)
else:
    dist.recv(torch.empty(3), src=0, tag=5)
objs = [None] * world
dist.all_gather_object(objs, rank)
dist.destroy_process_group()
