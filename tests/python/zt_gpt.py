"""A GPT-style model and the training loop the optimizer tests run, shared by the rank processes
(zt_optim_worker.py) and the single-process torch reference the tests compute on the global batch.

The loop is plain torch: param groups with no weight decay on biases, LayerNorms (nanoGPT's
recipe), a torch LR scheduler, opt.zero_grad(set_to_none=...) at the top of each step, an
auxiliary head some steps do not use (its gradient stays None: torch skips it), or that only
some samples of the global batch go through (aux_samples: so only some ranks use it), and
optionally a zero_grad between backward and step (torch steps on what is left: None or
zeros)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, CONTEXT, HEADS = 13, 8, 5, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        # No bias on q, k, v: a key bias shifts every score of a query alike, so its gradient is
        # zero up to rounding, which Adam would magnify into steps of arbitrary sign.
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // HEADS)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.aux_head = nn.Linear(WIDTH, VOCAB)  # used on some steps only

    def forward(self, idx, aux=False):
        """aux: whether every sample goes through the aux head, or a mask of the samples that
        do (the head is not reached when none does)."""
        pos = torch.arange(idx.shape[1])
        h = self.ln_f(self.blocks(self.wte(idx) + self.wpe(pos)))
        logits = self.head(h)
        if isinstance(aux, torch.Tensor):
            if not aux.any():
                return logits
            return logits.index_add(0, aux.nonzero().squeeze(1), self.aux_head(h[aux]))
        return logits + self.aux_head(h) if aux else logits


def build(seed):
    torch.manual_seed(seed)
    return TinyGPT()


def param_groups(model, spec):
    """nanoGPT's groups: weight decay on matrices and embeddings, none on biases and norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": spec.get("weight_decay", 0.1)},
            {"params": no_decay, "weight_decay": 0.0, "lr": spec.get("lr", 3e-3) / 3}]


def make_optimizer(model, spec):
    cls = torch.optim.Adam if spec.get("optimizer") == "adam" else torch.optim.AdamW
    return cls(param_groups(model, spec), lr=spec.get("lr", 3e-3), betas=(0.9, 0.95), eps=1e-8)


def make_scheduler(opt, spec):
    """OneCycleLR: it moves every group's lr and, cycling momentum, betas[0] at every step."""
    lr = spec.get("lr", 3e-3)
    return torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=[lr, lr / 3], total_steps=spec["total_steps"] + 1, pct_start=0.3,
        cycle_momentum=True, base_momentum=0.8, max_momentum=0.95)


def batch(step, micro, size):
    g = torch.Generator().manual_seed(7919 * step + micro)
    idx = torch.randint(0, VOCAB, (size, CONTEXT + 1), generator=g)
    return idx[:, :-1], idx[:, 1:]


def aux_used(spec, step):
    return step % 3 == 0 if spec.get("aux_head", True) else False


def aux_of(spec, step, size, local):
    """What model(x, aux=) takes on this step: True, False, or, with aux_samples [first, last),
    this rank's part of the global batch's mask of those samples."""
    if not aux_used(spec, step) or "aux_samples" not in spec:
        return aux_used(spec, step)
    first, last = spec["aux_samples"]
    return local(torch.arange(size) >= first) & local(torch.arange(size) < last)


def train(model, opt, sched, spec, first, last, local, average):
    """Steps [first, last); `local` cuts this rank's part of a global batch, `average` gives the
    mean of a number over the ranks. Returns the global losses, lrs and betas[0] per step."""
    accumulation = spec.get("accumulation", 1)
    divide = spec.get("divide_loss", accumulation > 1)
    losses, lrs, beta1s = [], [], []
    for step in range(first, last):
        opt.zero_grad(set_to_none=spec.get("set_to_none", True))
        total = 0.0
        for micro in range(accumulation):
            size = spec.get("batch", 6)
            x, y = batch(step, micro, size)
            x, y = local(x), local(y)
            logits = model(x, aux=aux_of(spec, step, size, local))
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            total += loss.item() / accumulation
            (loss / accumulation if divide else loss).backward()
        discard = spec.get("discard_at", {}).get(str(step))
        if discard is not None:
            opt.zero_grad(set_to_none=discard)  # what backward gave is dropped
        lrs.append([g["lr"] for g in opt.param_groups])
        beta1s.append([g["betas"][0] for g in opt.param_groups])
        opt.step()
        sched.step()
        losses.append(average(total))
    return losses, lrs, beta1s


def reference(spec, first=0, last=None):
    """Single-process torch on the global batch: the model rank 0 builds, trained as the ranks
    do, with torch.optim.AdamW/Adam and the scheduler."""
    model = build(spec.get("seed", 0))
    opt = make_optimizer(model, spec)
    sched = make_scheduler(opt, spec)
    run = dict(spec, divide_loss=True)  # plain torch divides its loss by the accumulation count
    losses, lrs, beta1s = train(model, opt, sched, run, first,
                                spec["total_steps"] if last is None else last,
                                lambda t: t, lambda v: v)
    steps = {n: (int(opt.state[p]["step"]) if p in opt.state else 0)
             for n, p in model.named_parameters()}
    return {"losses": losses, "lrs": lrs, "beta1s": beta1s, "state": model.state_dict(),
            "steps": steps}
