"""A LightningModule trained by ``Trainer(accelerator="cpu", devices=2, strategy="ddp")``:
Lightning starts the second rank itself by running this script again. ``--rank0-callback``:
a callback reduces a metric on rank 0 alone (``if trainer.is_global_zero:``), a collective
the other rank never issues. ``--log``: every rank logs ``self.log("val_loss", ...,
sync_dist=True)`` in validation_step; ``--rank0-log``: ``self.log(..., sync_dist=True)`` under
``if self.trainer.is_global_zero:`` in validation_step, whose all-reduce Lightning issues at the
epoch's end (``--on-step``: at once, as the step logs it)."""

import argparse

import pytorch_lightning as pl
import torch


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                          torch.nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layers(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layers(x), y)
        if args.log:
            self.log("val_loss", loss, sync_dist=True, on_step=args.on_step)
        elif args.rank0_log and self.trainer.is_global_zero:
            self.log("val_loss", loss, sync_dist=True, on_step=args.on_step)  # ddpdoctor: log

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Rank0Metric(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 2 and trainer.is_global_zero:
            trainer.strategy.reduce(outputs["loss"].detach())  # ddpdoctor: callback


parser = argparse.ArgumentParser()
parser.add_argument("--rank0-callback", action="store_true")
parser.add_argument("--log", action="store_true")
parser.add_argument("--rank0-log", action="store_true")
parser.add_argument("--on-step", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1,
                     limit_train_batches=6, limit_val_batches=2,
                     num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                     logger=False, enable_checkpointing=False,
                     callbacks=[Rank0Metric()] if args.rank0_callback else [])
loader = torch.utils.data.DataLoader(data, batch_size=4)
trainer.fit(Net(), loader, loader if args.log or args.rank0_log else None)
if trainer.is_global_zero:
    print("trained", flush=True)
