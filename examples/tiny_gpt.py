"""A small GPT-style transformer (pre-norm blocks, causal self-attention, GELU MLP) for the CPU.

`checkpointed` names the blocks whose forward runs under torch.utils.checkpoint, so their
activations are recomputed in backward instead of being kept; `checkpoint_form` says what the
checkpoint is handed: the block ("module"), or a function of the model's own that calls it
("closure", as older `transformers` models did with `create_custom_forward(layer)`).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        k = k.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        v = v.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=256, d_model=128, n_heads=4, n_layers=6, seq_len=128,
                 checkpointed=(1, 3, 5), reentrant=True, checkpoint_form="module"):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.checkpointed = set(checkpointed)
        self.reentrant = reentrant
        if checkpoint_form not in ("module", "closure"):
            raise ValueError("checkpoint_form: module or closure, not %r" % (checkpoint_form,))
        self.checkpoint_form = checkpoint_form

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for i, block in enumerate(self.blocks):
            if i in self.checkpointed and self.training:
                function = block if self.checkpoint_form == "module" else custom_forward(block)
                x = checkpoint(function, x, use_reentrant=self.reentrant)
            else:
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def custom_forward(block):
    """A function that calls `block` (what a checkpoint of the "closure" form is handed)."""
    def run(*inputs):
        return block(*inputs)
    return run


def make_batch(gen, batch, seq_len, vocab):
    """A synthetic next-token task: the sequence counts up modulo vocab from a random start."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    seq = (start + torch.arange(seq_len + 1)) % vocab
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
