"""Every Python block of the README and the docs, run in the context it assumes: one process, a 1-rank Gloo group.

``python -m tests.docs_snippets OUT`` runs them all and writes ``{block: outcome}`` to OUT (JSON):
"ok", "skipped: <why>" or "failed: <the error's last lines>". ``tests/test_docs.py`` reads it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import tempfile
import textwrap
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from tests.versions import FSDP_COMPRESSES, WHY_NO_FSDP

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)


@dataclass(frozen=True)
class Context:
    """What a block assumes and what shows it did its work."""

    setup: str = ""
    """Code that makes the names the block uses but does not make (a model, a gradient, a directory)."""
    after: str = ""
    """Code that checks the block's results (assertions), or uses them as a user would next."""
    needs: str = ""
    """A module the block needs; where it is not installed the block is skipped."""
    replace: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """Edits of the block's text before it runs: a GPU's device for the CPU's, said in ``why``."""
    why: str = ""
    """Why the block is edited, or, with ``skip``, why it does not run here and which test runs the same calls."""
    skip: bool = False


MODEL = "model = torch.nn.Sequential(torch.nn.Linear(300, 701), torch.nn.Tanh(), torch.nn.Linear(701, 7))\n"
GRAD = "grad = torch.randn(1001, generator=torch.Generator().manual_seed(1))\n"
BATCH = "x, y = torch.randn(16, 300), torch.randn(16, 7)\nloss_fn = torch.nn.functional.mse_loss\n"
TRAINED = "loss_fn(model(x), y).backward()\n"
DEEPSPEED = """
import json
import compcoll
compcoll.init()
json.dump({"train_batch_size": 16, "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 2}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}, open("ds_config.json", "w"))
Path("checkpoints/global_step4").mkdir(parents=True)
Path("checkpoints/latest").write_text("global_step4")
moments = {i: {"step": 4, "exp_avg": torch.zeros(p.shape), "exp_avg_sq": torch.ones(p.shape)}
           for i, p in enumerate(model.parameters())}
torch.save({"module": model.state_dict(), "optimizer": {"state": moments, "param_groups": [{"params": list(moments)}]},
            "ds_version": "0.19.6"}, "checkpoints/global_step4/mp_rank_00_model_states.pt")
"""
"""A DeepSpeed config with a schedule, and a checkpoint folder laid out as DeepSpeed 0.19.6's engine saves one (its
OnebitAdam's state: torch's layout, at step 4)."""
GPT2 = """
from tests.integrations.huggingface_workers import Bytes, gpt2
model = gpt2()
train, evaluation = Bytes(64, 1), Bytes(16, 2)
"""

CONTEXTS: dict[str, Context] = {
    "model = DDP(model)": Context(
        setup="import compcoll.ddp\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n" + MODEL + BATCH,
        after="for _ in range(3):\n    loss_fn(model(x), y).backward()\n"),
    "from compcoll.optim import from_deepspeed_config, load_deepspeed_checkpoint, scheduler_from_deepspeed_config":
        Context(setup=MODEL + DEEPSPEED, after="opt.step()\nsched.step()\nassert opt.steps == 5 and opt.compressing\n"),
    "import torch, compcoll": Context(setup=GRAD, after="assert avg.shape == grad.shape\n"),
    "docs/guides/launching.md: import torch, compcoll": Context(),
    "work = compcoll.compressed_allreduce(grad, worker_error, server_error, comm, async_op=True)": Context(
        setup="import compcoll\ncomm = compcoll.init()\n" + GRAD
              + "n = compcoll.padded_numel(grad.numel(), comm.size)\n"
                "worker_error, server_error = torch.zeros(n), torch.zeros(n // comm.size)\n",
        after="assert work.is_completed() and torch.equal(avg, work.wait())\n"),
    "allreduce = compcoll.CompressedAllreduce(comm)": Context(
        setup="import compcoll\ncomm = compcoll.init()\n" + MODEL + BATCH + TRAINED,
        after="assert Path(f'ef-rank{comm.rank}.pt').exists()\n"),
    "avg = compcoll.hierarchical_allreduce(grad, comm, ranks_per_node=\"auto\", seed=0)": Context(
        setup="import compcoll\ncomm = compcoll.init()\n" + GRAD, after="assert avg.shape == grad.shape\n"),
    "topo = compcoll.topology(comm)": Context(
        setup="import compcoll\ncomm = compcoll.init()\n" + GRAD, after="assert avg.shape == grad.shape\n"),
    "def on_train_start(self):": Context(
        skip=True, why="a method of a LightningModule; tests/test_examples.py runs examples/lightning_trainer.py, "
                       "which has it, where Lightning is installed"),
    "compcoll.checkpoint.save(f\"{output_dir}/compcoll\", opt, hook_state)": Context(
        setup="import compcoll, compcoll.checkpoint, compcoll.ddp\nfrom compcoll.optim import OneBitAdam\n" + MODEL
              + "opt = OneBitAdam(model.parameters(), comm=compcoll.init())\nhook_state = compcoll.ddp.OneBitState()\n"
                "output_dir = 'output'\n",
        after="assert Path('output/compcoll/compcoll-rank0-of-1.pt').exists()\n"),
    "for block in model.blocks:": Context(
        setup="import compcoll.fsdp\nfrom torch.distributed.fsdp import fully_shard\n"
              "model = torch.nn.Module()\n"
              "model.blocks = torch.nn.ModuleList(torch.nn.Linear(13, 13) for _ in range(2))\n",
        after="x = torch.randn(4, 13)\nfor block in model.blocks:\n    x = block(x)\nx.sum().backward()\n"
              "assert all(p.grad is not None for p in model.parameters())\n",
        skip=not FSDP_COMPRESSES, why=WHY_NO_FSDP),
    "mesh = init_device_mesh(\"cuda\", (nodes, gpus_per_node), mesh_dim_names=(\"replicate\", \"shard\"))": Context(
        skip=True, why="HSDP's mesh needs 2 x 2 ranks; tests/fsdp/test_fsdp.py makes it on 4 Gloo ranks"),
    "from compcoll.integrations.huggingface import Trainer": Context(
        needs="transformers",
        setup=GPT2 + "import transformers\ntraining_args = transformers.TrainingArguments(output_dir='hf', "
                     "max_steps=2, per_device_train_batch_size=8, report_to=[], use_cpu=True)\n",
        after="assert trainer.state.global_step == 2\n"),
    "from compcoll.integrations.huggingface import register_hook": Context(
        needs="accelerate",
        setup=GPT2 + "import accelerate, compcoll.optim\naccelerator = accelerate.Accelerator(cpu=True)\nsteps = 10\n",
        after="batch = torch.stack([train[i]['input_ids'] for i in range(4)])\n"
              "accelerator.backward(model(input_ids=batch, labels=batch).loss)\noptimizer.step()\n"
              "assert optimizer.optimizer.steps == 1\n"),
    "from compcoll.optim import OneBitAdam, OneBitLamb, ZeroOneAdam, Birder": Context(
        setup="import compcoll\ncomm = compcoll.init()\n" + MODEL + BATCH + "my_shard_of_the_data = [(x, y)] * 3\n",
        after="assert opt.steps == 3\n"),
    "import torch.distributed.checkpoint as dcp": Context(
        setup="import compcoll\nfrom compcoll.optim import OneBitAdam\n" + MODEL + BATCH + TRAINED
              + "opt = OneBitAdam(model.parameters(), comm=compcoll.init())\nopt.step()\npath = 'dcp'\n",
        after="assert opt.steps == 1\n"),
    "from compcoll.optim.dcp import ElasticLoadPlanner": Context(
        setup="import compcoll\nimport torch.distributed.checkpoint as dcp\n"
              "from torch.distributed.checkpoint.state_dict import get_state_dict\n"
              "from compcoll.optim import OneBitAdam\n"
              + MODEL + BATCH + TRAINED + "opt = OneBitAdam(model.parameters(), comm=compcoll.init())\nopt.step()\n"
              "path = 'dcp-elastic'\nmodel_sd, opt_sd = get_state_dict(model, opt)\n"
              "dcp.save({'model': model_sd, 'optim': opt_sd}, checkpoint_id=path)\n",
        after="assert opt_sd['param_groups'][0]['compcoll']['steps'] == 1\n"),
    "from compcoll.optim import GradScaler": Context(
        setup="import compcoll\nfrom compcoll.optim import OneBitAdam\n" + MODEL + BATCH
              + "opt = OneBitAdam(model.parameters(), comm=compcoll.init())\n",
        replace=(('"cuda"', '"cpu"'),), why="no GPU here: the CPU's autocast and scaler",
        after="assert opt.steps + opt.skipped_steps == 1\n"),
}
"""Each block's context, by "<file>: <first line>" or, for the blocks of every file that begin so, by the first line
(a block without one fails ``tests/test_docs.py``)."""


def blocks() -> dict[str, str]:
    """``{"<file>: <first line>": code}`` of every Python block of README.md and docs/ (dedented; the first line
    without its comment)."""
    found = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for match in BLOCK.finditer(path.read_text()):
            code = textwrap.dedent(match.group(2))
            first = next(line for line in code.splitlines() if line.strip()).split("#")[0].strip()
            found[f"{path.relative_to(ROOT)}: {first}"] = code
    return found


def first_line(block: str) -> str:
    """The first line of a block named by ``blocks``."""
    return block.split(": ", 1)[1]


def run(code: str, context: Context) -> str:
    """The outcome of one block in its context, in a fresh namespace."""
    if context.skip:
        return f"skipped: {context.why}"
    if context.needs and importlib.util.find_spec(context.needs) is None:
        return f"skipped: {context.needs} is not installed"
    for old, new in context.replace:
        code = code.replace(old, new)
    namespace = {"torch": __import__("torch"), "Path": Path}
    try:
        for part in (context.setup, code, context.after):
            exec(compile(part, "<block>", "exec"), namespace)
    except Exception:
        return "failed: " + "".join(traceback.format_exc().splitlines(keepends=True)[-6:])
    return "ok"


def main(out: str) -> None:
    """Run every block with a context over a 1-rank Gloo group, in a scratch directory removed after, and write the
    outcomes to ``out``."""
    import torch.distributed as dist

    home = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="compcoll-docs-") as scratch:
        os.chdir(scratch)
        store = dist.FileStore(str(Path(scratch) / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        outcomes = {}
        for name, code in blocks().items():
            context = CONTEXTS.get(name, CONTEXTS.get(first_line(name)))
            outcomes[name] = "failed: no context in tests/docs_snippets.py" if context is None else run(code, context)
        dist.destroy_process_group()
        os.chdir(home)
    Path(out).write_text(json.dumps(outcomes, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
