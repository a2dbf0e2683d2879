"""Model shapes and presets (torch-free, so configs can be validated without torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    #: SwiGLU hidden size.
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 8192

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def num_params(self, *, embeddings: bool = True) -> int:
        kv = self.n_kv_heads * self.head_dim
        attn = self.dim * self.dim * 2 + self.dim * kv * 2
        mlp = 3 * self.dim * self.ffn_dim
        per_layer = attn + mlp + 2 * self.dim
        n = self.n_layers * per_layer + self.dim + self.vocab_size * self.dim  # final norm + output
        return n + (self.vocab_size * self.dim if embeddings else 0)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x (non-embedding params) + 12 x layers x dim x seq_len.

        The attention term counts the full (not causal-halved) score matrix, as TorchTitan and
        the PaLM paper do, so our MFU numbers compare with theirs.
        """
        return 6.0 * self.num_params(embeddings=False) + 12.0 * self.n_layers * self.dim * seq_len

    def problems(self, *, tp: int, stages: int) -> list[str]:
        """What stops this model from being split tp ways and into ``stages`` pipeline stages."""
        out: list[str] = []
        if self.dim % self.n_heads:
            out.append(f"model: dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            out.append(f"model: n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.n_kv_heads % tp or self.n_heads % tp or self.ffn_dim % tp:
            out.append(
                f"parallelism.tensor: {tp} must divide n_heads ({self.n_heads}), n_kv_heads ({self.n_kv_heads}) and "
                f"ffn_dim ({self.ffn_dim}) of this preset"
            )
        if stages > self.n_layers:
            out.append(
                f"parallelism.pipeline: {stages} stages but the preset has only {self.n_layers} layers; use fewer "
                "stages or a bigger preset"
            )
        return out


PRESETS: dict[str, ModelArgs] = {
    # CPU tests: a few thousand parameters per layer, learns the synthetic language in seconds.
    "tiny": ModelArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=256, ffn_dim=128),
    "small": ModelArgs(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=32768, ffn_dim=1536),
    # Llama-3.2-1B and Llama-3.1-8B shapes.
    "1b": ModelArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=8192),
    "8b": ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336),
}
