"""A ``OneBitState`` built before Lightning starts its ranks by spawning, carried to each (tests/ddp/test_onebit.py).

Lightning's spawning launcher (``DDPStrategy(start_method="spawn")``, the "ddp_spawn" strategy) pickles the strategy,
its ``ddp_comm_state`` with it, to every new process, before ``init_process_group``. On CPUs Lightning registers no
communication hook, so the module registers the carried state itself when training starts (on GPUs Lightning does
that); at the end every rank checks the state took the group and compressed, and that the replicas are identical,
and closes the group once Lightning has let go of the DDP model (``Closing``).
"""

import lightning
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

import compcoll
import compcoll.ddp


class Regression(lightning.LightningModule):
    """A linear model of 20 features fitted with SGD on 256 fixed samples."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(20, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_start(self) -> None:
        state = self.trainer.strategy._ddp_comm_state
        assert isinstance(state, compcoll.ddp.OneBitState) and state.comm is None, state
        self.trainer.strategy.model.register_comm_hook(state, compcoll.ddp.onebit_hook)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        x = torch.randn(256, 20, generator=torch.Generator().manual_seed(1))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :3].sum(1, keepdim=True)),
                                           batch_size=16)

    def on_train_end(self) -> None:
        state = self.trainer.strategy._ddp_comm_state
        assert state.comm is not None and state.allreduce.plans, "the carried state compressed nothing"
        flat = torch.cat([p.detach().reshape(-1) for p in self.parameters()])
        table = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(table, flat)
        assert all(torch.equal(flat, other) for other in table), "replicas differ"
        print(f"rank {dist.get_rank()}: the spawned OneBitState compressed; replicas bit-identical", flush=True)


class Closing(DDPStrategy):
    """Lightning's DDP strategy, closing the process group when it tears down (Lightning closes NCCL's at exit, not
    Gloo's), after it unwrapped the DDP model, whose reducer would hold the group."""

    def teardown(self) -> None:
        super().teardown()
        compcoll.shutdown()


if __name__ == "__main__":
    state = compcoll.ddp.OneBitState(min_compress_numel=1)
    trainer = lightning.Trainer(accelerator="cpu", devices=2, max_steps=6, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                strategy=Closing(start_method="spawn", process_group_backend="gloo",
                                                 ddp_comm_state=state, ddp_comm_hook=compcoll.ddp.onebit_hook))
    trainer.fit(Regression())
