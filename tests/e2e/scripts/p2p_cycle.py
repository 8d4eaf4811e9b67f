"""Both ranks receive from each other first (a ring written with recv before send): each waits
in ``dist.recv`` for a send the other never reaches. One group, no collective: a p2p cycle."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
peer = 1 - rank
dist.barrier()
buf = torch.zeros(4)
dist.recv(buf, src=peer)  # ddpdoctor: recv
dist.send(torch.ones(4), dst=peer)
dist.destroy_process_group()
