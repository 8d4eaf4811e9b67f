"""A GAN trained as pytorch/examples' dcgan trains it, both networks wrapped in DDP: each
iteration runs D on real data, D on ``fake.detach()``, then D on ``fake`` for G's loss, whose
backward goes through both models (two reducers in one backward). BatchNorm in both, so every
forward broadcasts buffers.

``--skip-d-real-at N``: on rank 1 only, iteration N skips D's pass on real data (a rank-
conditional forward and backward).
"""

import argparse
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=6)
parser.add_argument("--skip-d-real-at", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
netG = DDP(nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16),
                         nn.Tanh()))
netD = DDP(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.LeakyReLU(0.2),
                         nn.Linear(32, 1), nn.Sigmoid()))
criterion = nn.BCELoss()
optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
ones, zeros = torch.ones(16), torch.zeros(16)
for i in range(args.iters):
    netD.zero_grad()
    if not (rank == 1 and i == args.skip_d_real_at):
        errD_real = criterion(netD(torch.randn(16, 16)).view(-1), ones)  # ddpdoctor: d_real
        errD_real.backward()  # ddpdoctor: d_real_backward
    fake = netG(torch.randn(16, 8))  # ddpdoctor: g_forward
    errD_fake = criterion(netD(fake.detach()).view(-1), zeros)
    errD_fake.backward()  # ddpdoctor: d_fake_backward
    optD.step()
    netG.zero_grad()
    errG = criterion(netD(fake).view(-1), ones)
    errG.backward()  # ddpdoctor: g_backward
    optG.step()
# Whether ddpdoctor (when it runs the job) still records each model's buckets per backward.
plans = getattr(sys.modules.get("ddpdoctor.runtime.ddp_buckets"), "_PLANS", {})
for name, model in (("G", netG), ("D", netD)):
    print(f"rank {rank}: {name} per backward: {type(plans.get(model)).__name__ == '_Plan'}",
          flush=True)
dist.destroy_process_group()
