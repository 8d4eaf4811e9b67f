"""A Lightning Trainer with a validation loop over 5 epochs of 64 batches; each rank writes the
batches it trained and validated per epoch to ``OUT.rank-N.json`` (OUT: the first argument)."""

import json
import sys

import pytorch_lightning as pl
import torch

OUT = sys.argv[1]


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                          torch.nn.Linear(16, 2))
        self.seen: dict[str, list[int]] = {"train": [], "val": []}
        self.trained = self.validated = 0

    def training_step(self, batch, batch_idx):
        self.trained += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.layers(x), y)

    def validation_step(self, batch, batch_idx):
        self.validated += 1
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layers(x), y), sync_dist=True)

    def on_train_epoch_end(self) -> None:
        self.seen["train"].append(self.trained)
        self.seen["val"].append(self.validated)
        self.trained = self.validated = 0
        with open(f"{OUT}.rank-{self.global_rank}.json", "w") as fh:
            json.dump(self.seen, fh)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 2))
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=5,
                     enable_progress_bar=False, enable_model_summary=False, logger=False,
                     enable_checkpointing=False, num_sanity_val_steps=0)
trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=4),
            torch.utils.data.DataLoader(data, batch_size=4))
