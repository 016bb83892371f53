"""The training patterns of real loops that stage 3 used to fail on (issue 30), as modules
zt_models builds by name: activation checkpointing (reentrant and not) over several blocks, a GPT
whose embedding and tied head sit outside its checkpointed blocks, a block called twice beside a
tied head and a frozen layer, a branch only some ranks take, and a 4-layer MLP for a penalty on
the weights (zt_worker's "penalty")."""

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IN, OUT = 7, 5


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return x + self.norm(torch.tanh(self.fc(x)))


def _run(modules, x):
    for m in modules:
        x = m(x)
    return x


class CheckpointedBlocks(nn.Module):
    """Non-reentrant checkpointing over two blocks at once, then a block of its own, then the
    head (each a separate checkpoint call)."""

    REENTRANT = False

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, 11)
        self.blocks = nn.ModuleList(Block(11) for _ in range(3))
        self.out = nn.Linear(11, OUT)

    def forward(self, x):
        h = self.inp(x)
        ck = functools.partial(checkpoint, use_reentrant=self.REENTRANT)
        h = ck(functools.partial(_run, self.blocks[:2]), h)
        h = ck(self.blocks[2], h)
        return self.out(h)


class ReentrantTail(CheckpointedBlocks):
    """Reentrant checkpointing (torch 1.13's default) of the last blocks and the head: backward
    starts inside a checkpoint, so its parameters get their gradients in a nested backward."""

    REENTRANT = True

    def forward(self, x):
        h = self.blocks[0](self.inp(x))
        return checkpoint(functools.partial(_run, [*self.blocks[1:], self.out]), h,
                          use_reentrant=True)


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        # No bias: the keys' would get a gradient that is zero up to rounding (softmax ignores
        # a shift), which Adam magnifies into steps of arbitrary sign.
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (k.shape[-1] ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                 nn.Linear(2 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, checkpointed blocks, a final norm and a head tied to the
    token embedding, as nanoGPT with activation checkpointing."""

    VOCAB = 13
    REENTRANT = False

    def __init__(self, width=8, heads=2, layers=3, context=4):
        super().__init__()
        self.wte = nn.Embedding(self.VOCAB, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(GPTBlock(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, self.VOCAB, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        h = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=self.REENTRANT)
        return self.head(self.ln_f(h))


class ReentrantGPT(TinyGPT):
    REENTRANT = True


class ReusedTiedFrozen(nn.Module):
    """One block called twice, a head tied to the embedding, and a frozen projection."""

    VOCAB = 11

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(self.VOCAB, 9)
        self.frozen = nn.Linear(9, 9)
        self.frozen.requires_grad_(False)
        self.block = Block(9)
        self.head = nn.Linear(9, self.VOCAB, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        h = torch.relu(self.frozen(self.wte(idx)))
        h = self.block(self.block(h))
        return self.head(h)


class Branch(nn.Module):
    """A layer only the samples marked in their first feature go through, where the first sample
    of a rank's part decides: with the global batch's second half marked, the last rank takes the
    branch and the first does not. Layers on both sides of it, so that at stage 2 with small
    buckets it sits between buckets."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, 12)
        self.before = nn.Linear(12, 12)
        self.extra = nn.Sequential(nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 12))
        self.after = nn.Linear(12, 12)
        self.out = nn.Linear(12, OUT)

    def forward(self, x):
        h = torch.tanh(self.before(torch.relu(self.inp(x))))
        if bool(x[0, 0] > 0):
            h = h + self.extra(h)
        return self.out(torch.tanh(self.after(h)))


class MLP4(nn.Module):
    """Four layers, for a penalty on the weights inside zt.gathered (as the README's example)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(IN, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                                    nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, OUT))

    def forward(self, x):
        return self.layers(x)


MODELS = {"ckpt": CheckpointedBlocks, "ckpt_reentrant": ReentrantTail, "gpt": TinyGPT,
          "gpt_reentrant": ReentrantGPT, "reused_tied_frozen": ReusedTiedFrozen,
          "branch": Branch, "mlp4": MLP4}
TOKEN_MODELS = {"gpt", "gpt_reentrant", "reused_tied_frozen"}


def batch(name, step, size, generator):
    """The global batch of `step` for the models above that need their own data."""
    if name in TOKEN_MODELS:
        vocab, context = MODELS[name].VOCAB, 4
        x = torch.randint(0, vocab, (size, context), generator=generator)
        y = torch.randint(0, vocab, (size, context), generator=generator)
        return x, y
    x = torch.randn(size, IN, generator=generator)
    y = torch.randint(0, OUT, (size,), generator=generator)
    if name == "branch":
        x[:, 0] = torch.where(torch.arange(size) >= size // 2, 1.0, -1.0)
    return x, y
