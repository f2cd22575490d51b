"""The convergence benchmark's tasks on data shipped with installed packages: scikit-learn's digits, Python's docs."""

from __future__ import annotations

import math

import numpy as np
import torch

from compcoll.launcher import seeded


def load_digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 1797 8x8 digits that ship inside scikit-learn (no download): a fixed 80/20 split, pixels / 16."""
    from sklearn.datasets import load_digits as bundled

    data = bundled()
    order = np.random.default_rng(0).permutation(len(data.target))
    x = torch.tensor(data.data[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target[order], dtype=torch.int64)
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def make_model(hidden: int) -> torch.nn.Module:
    with seeded(0):
        return torch.nn.Sequential(
            torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, 10),
        )


def parameter_dtype(config: dict) -> torch.dtype:
    """The model's parameter dtype: ``config["dtype"]`` ("float32", the default, or "bfloat16", "float16")."""
    return getattr(torch, config.get("dtype", "float32"))


class Digits:
    """An MLP 64-hidden-hidden-10 on the digits (parameters and pixels in the config's dtype); metric: test accuracy."""

    metric = "test_accuracy"

    def __init__(self, config: dict) -> None:
        dtype = parameter_dtype(config)
        x_train, self.y_train, x_test, self.y_test = load_digits()
        self.x_train, self.x_test = x_train.to(dtype), x_test.to(dtype)
        self.model = make_model(config["hidden"]).to(dtype)
        rng = np.random.default_rng(config["seed"])
        epochs = config["steps"] * config["batch"] // len(self.y_train) + 2
        self.order = np.concatenate([rng.permutation(len(self.y_train)) for _ in range(epochs)])
        self.batch = config["batch"]

    def loss(self, step: int, rank: int, size: int) -> torch.Tensor:
        """This rank's share (1/size) of global batch ``step``."""
        per_rank = self.batch // size
        index = self.order[step * self.batch:(step + 1) * self.batch][rank * per_rank:(rank + 1) * per_rank]
        return torch.nn.functional.cross_entropy(self.model(self.x_train[index]).float(), self.y_train[index])

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The loss on the whole training set and the test accuracy."""
        loss = torch.nn.functional.cross_entropy(self.model(self.x_train).float(), self.y_train).item()
        accuracy = (self.model(self.x_test).argmax(dim=1) == self.y_test).float().mean().item()
        return {"train_loss": loss, "test_accuracy": accuracy}


def load_text() -> bytes:
    """Python's reference documentation as it ships inside Python (``pydoc_data.topics``), about 0.7 MB of prose."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics)).encode("ascii", "replace")


class CausalLM(torch.nn.Module):
    """A small pre-norm causal transformer over bytes: embedding, ``layers`` blocks, a tied output."""

    def __init__(self, width: int, layers: int, context: int, heads: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(128, width)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.position = torch.nn.Parameter(torch.randn(context, width) * 0.02)
        block = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.position[:n]
        h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
        return self.norm(h) @ self.embed.weight.T


class TextLM:
    """Next-byte prediction on Python's docs: the first 90% trains, the last 10% validates; metric: validation loss.

    The parameters are in the config's dtype; the loss is taken in float32.

    Each global batch is ``batch`` windows of ``context`` + 1 bytes at random offsets of the
    training part (the same offsets in every run); rank r takes its 1/size of them.
    """

    metric = "val_loss"

    def __init__(self, config: dict) -> None:
        text = torch.tensor(np.frombuffer(load_text(), dtype=np.uint8).astype(np.int64))
        cut = int(0.9 * len(text))
        self.train_text, self.val_text = text[:cut], text[cut:]
        self.context, self.batch = config["context"], config["batch"]
        with seeded(0):
            self.model = CausalLM(config["hidden"], config["layers"], self.context).to(parameter_dtype(config))
        rng = np.random.default_rng(config["seed"])
        self.offsets = rng.integers(0, cut - self.context - 1, size=(config["steps"], self.batch))
        starts = np.linspace(0, len(self.val_text) - self.context - 1, 64).astype(np.int64)
        self.val = torch.stack([self.val_text[s:s + self.context + 1] for s in starts])
        probe = np.random.default_rng(1).integers(0, cut - self.context - 1, size=64)
        self.probe = torch.stack([self.train_text[s:s + self.context + 1] for s in probe])

    def _loss(self, windows: torch.Tensor) -> torch.Tensor:
        logits = self.model(windows[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 windows[:, 1:].reshape(-1))

    def loss(self, step: int, rank: int, size: int) -> torch.Tensor:
        per_rank = self.batch // size
        starts = self.offsets[step][rank * per_rank:(rank + 1) * per_rank]
        return self._loss(torch.stack([self.train_text[s:s + self.context + 1] for s in starts]))

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The loss on 64 fixed training windows and on 64 windows spread over the validation part (nats/byte)."""
        val = self._loss(self.val).item()
        return {"train_loss": self._loss(self.probe).item(), "val_loss": val if math.isfinite(val) else float("nan")}


TASKS = {"digits": Digits, "lm": TextLM}
