"""Modules the front-end tests train, each built from a seed, and the data they train on.

Shared by the rank processes (zt_worker.py) and the tests, which compute the unsharded reference
with the same modules and batches."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import zt_pattern_models

IN, OUT = 7, 5  # sizes that divide by nothing, so shards are uneven and padded


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return x + self.norm(torch.tanh(self.fc(x)))


class Nested(nn.Module):
    """Nested modules, a Sequential inside, a parameter held by the root itself."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, 13)
        self.blocks = nn.Sequential(Block(13), Block(13))
        self.out = nn.Linear(13, OUT)
        self.gain = nn.Parameter(torch.ones(OUT))

    def forward(self, x):
        return self.out(self.blocks(torch.relu(self.inp(x)))) * self.gain


class Tied(nn.Module):
    """Token embedding and output projection share one weight (as GPT-2 does)."""

    VOCAB = 11

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(self.VOCAB, 9)
        self.block = Block(9)
        self.head = nn.Linear(9, self.VOCAB, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        return self.head(self.block(self.wte(idx)))


class Frozen(nn.Module):
    """A frozen first layer: not in the optimizer, not sharded, still used."""

    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(IN, 13)
        self.frozen.requires_grad_(False)
        self.train_me = nn.Linear(13, OUT)

    def forward(self, x):
        return self.train_me(torch.relu(self.frozen(x)))


class WithBatchNorm(nn.Module):
    """BatchNorm: running statistics are buffers and stay per rank (DDP without SyncBatchNorm)."""

    def __init__(self):
        super().__init__()
        # No bias before BatchNorm: its gradient is zero up to rounding, which Adam would
        # magnify into steps of arbitrary sign (in any implementation).
        self.fc = nn.Linear(IN, 12, bias=False)
        self.bn = nn.BatchNorm1d(12)
        self.out = nn.Linear(12, OUT)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


class Reused(nn.Module):
    """One module called twice in a forward, and a layer the forward never reaches."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, 10)
        self.shared = nn.Linear(10, 10)
        self.unused = nn.Linear(10, 10)
        self.out = nn.Linear(10, OUT)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        h = torch.tanh(self.shared(h))
        h = torch.tanh(self.shared(h))
        return self.out(h)


class Sometimes(nn.Module):
    """A second head that every third forward uses (counted per call, so that every rank and each
    replica of the reference agree): after zero_grad(set_to_none=True) torch skips it on the
    other steps; after zero_grad(set_to_none=False) it steps on zeros once used."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(IN, 9)
        self.out = nn.Linear(9, OUT)
        self.extra = nn.Linear(9, OUT)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.tanh(self.body(x))
        return self.out(h) + self.extra(h) if self.calls % 3 == 1 else self.out(h)


class OutsideUse(nn.Module):
    """The root's forward uses emb.weight directly, outside the embedding's own forward."""

    VOCAB = 11

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(self.VOCAB, 8)
        self.mix = nn.Linear(8, 8)

    def forward(self, idx):
        return F.linear(torch.tanh(self.mix(self.emb(idx))), self.emb.weight)


class Elementwise(nn.Module):
    """Only element-wise ops, which torch 1.13 has in fp16 on the CPU (it has no fp16 matmul):
    the fp16 path (loss scaling) can run here."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(IN) * 0.5 + 1)
        self.shift = nn.Parameter(torch.randn(IN) * 0.1)
        self.mix = nn.Parameter(torch.randn(OUT, IN) * 0.3)

    def forward(self, x):
        h = x * self.scale + self.shift
        return (h.unsqueeze(1) * self.mix).sum(-1)


class WithBuffers(Nested):
    """Buffers of other dtypes than the parameters': an int64 permutation and an fp64 table, which
    every rank must take from rank 0 bit for bit, as DDP broadcasts them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("perm", torch.randperm(IN))
        self.register_buffer("table", torch.randn(3, dtype=torch.float64) / 3)

    def forward(self, x):
        return super().forward(x[:, self.perm] + self.table.sum().float())


MODELS = {"buffers": WithBuffers, "elementwise": Elementwise, "nested": Nested, "tied": Tied,
          "frozen": Frozen, "batchnorm": WithBatchNorm, "reused": Reused, "outside": OutsideUse,
          "sometimes": Sometimes}
TOKEN_MODELS = {"tied", "outside"}
MODELS.update(zt_pattern_models.MODELS)
TOKEN_MODELS |= zt_pattern_models.TOKEN_MODELS


def build(name, seed):
    torch.manual_seed(seed)
    return MODELS[name]()


def build_for_rank(name, seed, rank):
    """A rank's module in a job: every rank but 0 starts from other values, which zt.shard must
    replace with rank 0's."""
    return build(name, seed + (0 if rank == 0 else 100 + rank))


def batch(name, step, size, seed=0):
    """The global batch of `step`: inputs and integer targets."""
    g = torch.Generator().manual_seed(1000 * seed + step)
    if name in zt_pattern_models.MODELS:
        return zt_pattern_models.batch(name, step, size, g)
    if name in TOKEN_MODELS:
        vocab = MODELS[name].VOCAB
        x = torch.randint(0, vocab, (size, 4), generator=g)
        y = torch.randint(0, vocab, (size, 4), generator=g)
        return x, y
    return torch.randn(size, IN, generator=g), torch.randint(0, OUT, (size,), generator=g)


def loss_fn(name, out, y):
    if name in TOKEN_MODELS:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
    return F.cross_entropy(out.float(), y)


def l2(model):
    """A penalty on the trainable weights (the sum of their squares)."""
    return sum((p ** 2).sum() for p in model.parameters() if p.requires_grad)
