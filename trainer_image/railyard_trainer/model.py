"""A LLaMA-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention.

Written so that tensor and pipeline parallelism need no change here:

- attention reshapes with ``-1`` heads, so after a column-wise split each rank simply sees
  ``n_heads / tp`` local heads;
- layers live in a ``ModuleDict`` keyed by their index, and ``forward`` skips the embedding,
  final norm and output when they are ``None``: a pipeline stage is this model with the other
  stages' pieces deleted, and parameter names stay the same in every layout (checkpoints
  reshard between layouts by name).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from railyard_trainer.model_args import ModelArgs


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """cos and sin of the rotary angles, stacked: (2, max_seq_len, head_dim / 2), float32."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv)
    return torch.stack((angles.cos(), angles.sin()))


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (even, odd) of the last dim of x: (batch, seq, heads, head_dim)."""
    seq = x.shape[1]
    cos = rope[0, :seq].view(1, seq, 1, -1)
    sin = rope[1, :seq].view(1, seq, 1, -1)
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        # -1 heads: under tensor parallelism these are the rank's local heads.
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        proj: torch.Tensor = self.wo(out.transpose(1, 2).reshape(bs, seq, -1))
        return proj

    def init_weights(self, std: float, out_std: float) -> None:
        for lin in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=out_std, a=-3 * out_std, b=3 * out_std)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
        nn.init.trunc_normal_(self.w3.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
        nn.init.trunc_normal_(self.w2.weight, mean=0.0, std=out_std, a=-3 * out_std, b=3 * out_std)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.n_layers = args.n_layers
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = x + self.attention(self.attention_norm(x), rope)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out

    def init_weights(self) -> None:
        std = 0.02
        out_std = std / math.sqrt(2 * (self.layer_id + 1))
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(std, out_std)
        self.feed_forward.init_weights(std, out_std)


class Transformer(nn.Module):
    rope: torch.Tensor

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.dim, args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Not a parameter and not saved: recomputed from the shape.
        self.register_buffer("rope", rope_tables(args.head_dim, args.max_seq_len, args.rope_theta), persistent=False)
        self.init_weights()

    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """(Re)initialise every weight; also after ``to_empty`` when built on the meta device."""
        with torch.no_grad():
            rope = rope_tables(
                self.args.head_dim, self.args.max_seq_len, self.args.rope_theta, buffer_device or self.rope.device
            )
            if self.rope.device.type == "meta":
                self.rope = rope
            else:
                self.rope.copy_(rope)
            if self.tok_embeddings is not None:
                nn.init.normal_(self.tok_embeddings.weight)
            for layer in self.layers.values():
                layer.init_weights()  # type: ignore[operator]
            if self.norm is not None:
                self.norm.reset_parameters()
            if self.output is not None:
                std = self.args.dim**-0.5
                nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, seq) int64 -> logits (batch, seq, vocab); a middle pipeline stage
        takes and returns hidden states (batch, seq, dim)."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h).float()
        return h


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss; the pipeline schedules call it once per microbatch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
