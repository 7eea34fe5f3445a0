"""A character-level transformer trained on a few of Shakespeare's sonnets (examples/data/sonnets.txt), then sampled.

    python examples/gpt_tiny.py              # train (the loss falls from ~4.2), then print sampled text
    python examples/gpt_tiny.py --short      # a few steps; exits non-zero unless the loss fell (CI)
    python examples/gpt_tiny.py --no-jit     # eager: every step scheduled again

The model (GPT-style, pre-norm): token and position Embeddings, `--layers` blocks of causal multi-head attention
(Tensor.scaled_dot_product_attention with is_causal=True) and a GELU MLP, each behind a LayerNorm and added back,
a final LayerNorm and a linear head to the characters. Trained with AdamW on random windows of the text; the
training step and the sampling forward each run under TinyJit (fixed shapes: the sampler always feeds the last
`--ctx` characters).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from zeptograd import Tensor, TinyJit, nn  # noqa: E402
from zeptograd.nn.state import get_parameters  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sonnets.txt")


class Block:
    def __init__(self, dim: int, heads: int):
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def __call__(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (b, heads, t, head_dim)
        att = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(att)
        return x + self.fc2(self.fc1(self.ln2(x)).gelu())


class GPT:
    def __init__(self, vocab: int, ctx: int, dim: int, heads: int, layers: int):
        self.ctx = ctx
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = [Block(dim, heads) for _ in range(layers)]
        self.ln_f, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def __call__(self, idx: Tensor) -> Tensor:
        """(batch, t) character ids -> (batch, t, vocab) logits of the next character."""
        pos = Tensor.arange(idx.shape[1]).reshape(1, -1)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        return self.head(self.ln_f(x.sequential(self.blocks)))


def load_corpus(path: str = DATA) -> tuple[str, list[str], np.ndarray]:
    """(the text, its sorted characters, the text as int32 character ids)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    return text, chars, np.array([stoi[c] for c in text], dtype=np.int32)


def make_train_step(model: GPT, lr: float) -> tuple[nn.optim.Optimizer, Callable[[Tensor, Tensor], Tensor]]:
    """The optimizer (AdamW over every parameter) and the training step (not jitted): one step on a batch of
    (batch, t) inputs and next-character targets, returning the loss before the update. bench/cases_train.py's
    gpt_tiny_train times this step."""
    opt = nn.optim.AdamW(get_parameters(model), lr=lr, weight_decay=0.01)

    def train_step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        loss = loss.detach()
        opt.step(loss)  # one schedule: forward, backward, the update and the loss (before the update)
        return loss

    return opt, train_step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--short", action="store_true", help="train a few steps and check that the loss fell (for CI)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: 300, or 8 with --short)")
    ap.add_argument("--jit", action=argparse.BooleanOptionalAction, default=True, help="TinyJit (default: on)")
    ap.add_argument("--bs", type=int, default=16, help="batch size")
    ap.add_argument("--ctx", type=int, default=32, help="context length")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--sample", type=int, default=None, help="characters to sample (default: 300, or 24 with --short)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    steps = args.steps if args.steps is not None else (8 if args.short else 300)
    n_sample = args.sample if args.sample is not None else (24 if args.short else 300)

    text, chars, data = load_corpus()
    print(f"{len(text)} characters, a vocabulary of {len(chars)}")

    Tensor.manual_seed(args.seed)
    model = GPT(len(chars), args.ctx, args.dim, args.heads, args.layers)
    opt, train_step = make_train_step(model, args.lr)
    print(f"{sum(p.numel() for p in opt.params)} parameters")

    step = TinyJit(train_step) if args.jit else train_step
    rng = np.random.default_rng(args.seed)
    losses = []
    t0 = time.perf_counter()
    with Tensor.train():
        for i in range(steps):
            starts = rng.integers(0, len(data) - args.ctx - 1, args.bs)
            x = np.stack([data[s : s + args.ctx] for s in starts])
            y = np.stack([data[s + 1 : s + args.ctx + 1] for s in starts])
            losses.append(step(Tensor(x), Tensor(y)).item())
            if i % 25 == 0 or i == steps - 1:
                print(f"step {i:4d}  loss {losses[-1]:.3f}  ({(i + 1) / (time.perf_counter() - t0):.1f} steps/s)")
    first, last = np.mean(losses[:2]), np.mean(losses[-2:])
    print(f"{steps} steps in {time.perf_counter() - t0:.1f} s; loss {first:.3f} -> {last:.3f}")

    # sampling: a forward on the last ctx characters, the next one drawn from its softmax (on the host)
    def logits_last(x: Tensor) -> Tensor:
        return model(x)[:, -1, :].realize()

    forward = TinyJit(logits_last) if args.jit else logits_last
    ctx = [int(c) for c in data[: args.ctx]]
    out = []
    with Tensor.no_grad():
        for _ in range(n_sample):
            logits = forward(Tensor(np.array([ctx[-args.ctx :]], dtype=np.int32))).numpy()[0] / args.temperature
            p = np.exp(logits - logits.max())
            nxt = int(rng.choice(len(chars), p=p / p.sum()))
            ctx.append(nxt)
            out.append(chars[nxt])
    print("sample:\n" + text[: args.ctx] + "".join(out))
    if args.short:
        fell = last < first
        print("loss fell" if fell else "loss did NOT fall")
        return 0 if fell else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
