"""A training loop as Hugging Face Accelerate writes it (``accelerator.prepare``,
``accelerator.backward``), run with ``accelerate launch``. ``--rank0-gather``: rank 0 alone
gathers a metric inside ``if accelerator.is_main_process:`` (a collective the other rank
never issues)."""

import argparse

import torch
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--rank0-gather", action="store_true")
args = parser.parse_args()
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 2))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, opt, loader = accelerator.prepare(model, opt, loader)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)  # ddpdoctor: backward
    opt.step()
    opt.zero_grad()
    if args.rank0_gather and step == 2 and accelerator.is_main_process:
        accelerator.gather(loss.detach())  # ddpdoctor: gather
accelerator.print("done")
accelerator.wait_for_everyone()
