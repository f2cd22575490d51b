"""Gradual unfreezing under PyTorch Lightning: a backbone frozen at the start joins a compcoll optimizer later.

Run (needs ``pip install lightning``; Lightning starts the ranks itself, Gloo on CPUs):
    python examples/lightning_finetuning.py --devices 2 --optimizer adam --unfreeze-epoch 1
Lightning's ``BaseFinetuning`` callback freezes the backbone before training, so
``configure_optimizers`` hands the optimizer the head alone; at the start of epoch
``--unfreeze-epoch`` it unfreezes the backbone and calls ``optimizer.add_param_group`` on every
rank, which lays the backbone into the optimizer's flat buffer from rank 0's values. 1-bit Adam,
1-bit LAMB and 0/1 Adam take new parameters in their warm-up only (``--warmup`` steps here; later
they raise ValueError on every rank, naming the step), Birder at any time. At the end every
rank checks its parameters are bit-identical to rank 0's, and that the backbone trained.
"""

import argparse

import lightning
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import BaseFinetuning
from lightning.pytorch.strategies import DDPStrategy

import compcoll
import compcoll.ddp
from compcoll.optim import Birder, OneBitAdam, OneBitLamb, ZeroOneAdam

OPTIMIZERS = {"adam": (OneBitAdam, "freeze_step"), "lamb": (OneBitLamb, "freeze_step"),
              "zeroone": (ZeroOneAdam, "var_freeze_step"), "birder": (Birder, None)}
"""Each optimizer and the name of its warm-up length."""


class Windows(torch.utils.data.Dataset):
    """A regression task: y = 2 (x0 + x1 + x2), for 20 features drawn per index."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(20, generator=torch.Generator().manual_seed(index))
        return x, 2 * x[:3].sum(0, keepdim=True)


class Unfreeze(BaseFinetuning):
    """The backbone frozen before training, unfrozen (lr 1e-3) at the start of epoch ``epoch``."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = epoch

    def freeze_before_training(self, pl_module: lightning.LightningModule) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: lightning.LightningModule, current_epoch: int,
                          optimizer: torch.optim.Optimizer) -> None:
        if current_epoch == self.epoch:
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr=1e-3)


class Regression(lightning.LightningModule):
    """A backbone and a head, trained by one of ``OPTIMIZERS`` that first holds the head alone."""

    def __init__(self, optimizer: str, warmup: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh())
        self.head = torch.nn.Linear(32, 1)
        self.optimizer, self.warmup = optimizer, warmup

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.head(self.backbone(x)), y)
        self.log("loss", loss)
        return loss

    def on_train_start(self) -> None:
        """Every gradient stays this rank's: the optimizer averages it in 1 bit (examples/lightning_trainer.py)."""
        self.trainer.strategy.model.register_comm_hook(None, compcoll.ddp.local_hook)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        cls, warmup = OPTIMIZERS[self.optimizer]
        trained = [p for p in self.parameters() if p.requires_grad]
        return cls(trained, lr=1e-2, comm=compcoll.TorchComm(), **({warmup: self.warmup} if warmup else {}))

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(Windows(), batch_size=16)


p = argparse.ArgumentParser()
p.add_argument("--devices", type=int, default=2)
p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--unfreeze-epoch", type=int, default=1)
p.add_argument("--warmup", type=int, default=40, help="the warm-up steps (8 a rank per epoch at 2 ranks)")
args = p.parse_args()

module = Regression(args.optimizer, args.warmup)
start = module.backbone[0].weight.detach().clone()
trainer = lightning.Trainer(accelerator="cpu", devices=args.devices, max_epochs=args.epochs, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            strategy=DDPStrategy(process_group_backend="gloo"),
                            callbacks=[Unfreeze(args.unfreeze_epoch)])
trainer.fit(module)
flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
table = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(table, flat)
assert all(torch.equal(flat, other) for other in table), "replicas differ"
moved = float((module.backbone[0].weight.detach() - start).abs().max())
assert moved > 0, "the backbone did not train"
opt = trainer.optimizers[0]
if trainer.global_rank == 0:
    print(f"{type(opt).__name__} under Lightning's BaseFinetuning: {opt.steps} steps, {len(opt.param_groups)} "
          f"groups, the backbone moved up to {moved:.4f}, replicas bit-identical on {dist.get_world_size()} ranks")
compcoll.shutdown()
