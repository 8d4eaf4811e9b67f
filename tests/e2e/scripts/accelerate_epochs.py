"""An Accelerate loop over 5 epochs of 64 batches, each followed by an evaluation pass
(``gather_for_metrics``); each rank writes what it saw to ``OUT.rank-N.json`` (OUT: the first
argument)."""

import json
import sys

import torch
from accelerate import Accelerator

OUT = sys.argv[1]
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 2))
loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
val = torch.utils.data.DataLoader(data, batch_size=4)
model, opt, loader, val = accelerator.prepare(model, opt, loader, val)
seen: dict = {"len": len(loader), "train": [], "val": []}
for _epoch in range(5):
    trained = 0
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        trained += 1
    seen["train"].append(trained)
    validated = 0
    with torch.no_grad():
        for x, _y in val:
            accelerator.gather_for_metrics(model(x))
            validated += 1
    seen["val"].append(validated)
    with open(f"{OUT}.rank-{accelerator.process_index}.json", "w") as fh:
        json.dump(seen, fh)
accelerator.wait_for_everyone()
