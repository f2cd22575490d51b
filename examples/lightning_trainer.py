"""1-bit Adam under PyTorch Lightning's DDP, with the hook that keeps DDP from averaging twice registered by hand.

Run (needs ``pip install lightning``; Lightning starts the ranks itself, Gloo on CPUs):
    python examples/lightning_trainer.py --devices 2
    python examples/lightning_trainer.py --devices 2 --without-hook   # to see the warning below
Lightning's ``DDPStrategy(ddp_comm_hook=...)`` registers a communication hook on CUDA only
(Lightning 2.6), so on CPUs the module registers ``compcoll.ddp.local_hook`` on the wrapped
model when training starts; without it every gradient is averaged twice, and the optimizer
warns at its first step that every rank handed it the same gradient. At the end every rank
checks its parameters are bit-identical to rank 0's.
"""

import argparse

import lightning
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

import compcoll
import compcoll.ddp
from compcoll.optim import OneBitAdam


class Windows(torch.utils.data.Dataset):
    """A regression task: y = 2 (x0 + x1 + x2), for 20 features drawn per index (every rank its own, by Lightning's
    sampler)."""

    def __len__(self) -> int:
        return 2048

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(20, generator=torch.Generator().manual_seed(index))
        return x, 2 * x[:3].sum(0, keepdim=True)


class Regression(lightning.LightningModule):
    """An MLP trained with 1-bit Adam, warming up for ``freeze_step`` steps."""

    def __init__(self, freeze_step: int, hook: bool) -> None:
        super().__init__()
        self.hook = hook
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
        self.freeze_step = freeze_step

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def on_train_start(self) -> None:
        """Every gradient stays this rank's: the optimizer averages it in 1 bit (no second, float32 average)."""
        if self.hook and isinstance(self.trainer.strategy.model, torch.nn.parallel.DistributedDataParallel):
            self.trainer.strategy.model.register_comm_hook(None, compcoll.ddp.local_hook)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return OneBitAdam(self.parameters(), lr=1e-2, freeze_step=self.freeze_step, comm=compcoll.TorchComm())

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(Windows(), batch_size=16)


p = argparse.ArgumentParser()
p.add_argument("--devices", type=int, default=2)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--without-hook", action="store_true", help="leave DDP's float32 average on (the optimizer warns)")
args = p.parse_args()

module = Regression(freeze_step=args.steps // 4, hook=not args.without_hook)
trainer = lightning.Trainer(accelerator="cpu", devices=args.devices, max_steps=args.steps, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            strategy=DDPStrategy(process_group_backend="gloo"))
trainer.fit(module)
flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
table = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(table, flat)
assert all(torch.equal(flat, other) for other in table), "replicas differ"
if trainer.global_rank == 0:
    print(f"1-bit Adam under Lightning: {trainer.optimizers[0].steps} steps, final loss "
          f"{float(trainer.callback_metrics['loss']):.4f}, replicas bit-identical on {dist.get_world_size()} ranks")
compcoll.shutdown()  # a Gloo group left to the interpreter's exit can abort in torch's teardown
