"""The Hugging Face Trainer with 1-bit communication: change the Trainer's import, nothing else.

Run under torchrun (Gloo on CPUs, NCCL on GPUs; needs ``pip install 'compcoll[hf]'``):
    torchrun --nproc-per-node 2 examples/huggingface_trainer.py                    # compcoll's Trainer
    torchrun --nproc-per-node 2 examples/huggingface_trainer.py --trainer plain    # transformers' own, to compare
The model is a 2-layer byte-level GPT-2 built from its config, trained on the Zen of Python
(nothing is downloaded). compcoll's Trainer turns the default AdamW into 1-bit Adam, warming
up for 15% of the run, and keeps DDP from averaging twice. Rank 0 prints the eval loss; at
the end every rank checks its parameters are bit-identical to rank 0's.
"""

import argparse
import codecs
import this

import torch
import torch.distributed as dist
import transformers

import compcoll
from compcoll.integrations.huggingface import Trainer

p = argparse.ArgumentParser()
p.add_argument("--trainer", default="compcoll", choices=["compcoll", "plain"])
p.add_argument("--steps", type=int, default=60)
p.add_argument("--output-dir", default="hf_trainer_output")
args = p.parse_args()

text = torch.tensor(list(codecs.decode(this.s, "rot13").encode()))


def windows(count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """``count`` windows of 32 bytes at seeded offsets; the labels are the inputs (the model shifts them)."""
    starts = torch.randint(0, len(text) - 32, (count,), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": text[s:s + 32], "labels": text[s:s + 32]} for s in starts.tolist()]


torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=64,
                                                             n_layer=2, n_head=4))
training = transformers.TrainingArguments(output_dir=args.output_dir, max_steps=args.steps, learning_rate=1e-3,
                                          per_device_train_batch_size=8, seed=0, report_to=[], save_strategy="no",
                                          use_cpu=not torch.cuda.is_available())
cls = Trainer if args.trainer == "compcoll" else transformers.Trainer  # the one line
trainer = cls(model=model, args=training, train_dataset=windows(16 * args.steps, 1), eval_dataset=windows(64, 2))
trainer.train()
loss = trainer.evaluate()["eval_loss"]

flat = torch.cat([q.detach().reshape(-1) for q in trainer.model.parameters()])
first = flat.clone()
dist.broadcast(first, 0)
assert torch.equal(flat, first), f"rank {dist.get_rank()}: parameters differ from rank 0's"
if dist.get_rank() == 0:
    print(f"{args.trainer} Trainer: eval loss {loss:.4f} after {args.steps} steps; replicas identical")
compcoll.shutdown()
