"""COOT's building blocks, as the CrossCLR release and COOT's code build them.

Ginzburg et al. (COOT, NeurIPS 2020) sec. 3 and appendix; Zolfaghari et al. (CrossCLR, ICCV 2021)
appendix A and Table 7. The public CrossCLR release (github amazon-science/crossmodal-contrastive-learning,
``models/model.py``) carries COOT's model code; COOT's own is github gingsi/coot-videotext
(``nntrainer/models/transformer_legacy.py``, ``poolers.py``, ``encoder.py``, ``normalizations.py``).

- :class:`CootLayerNorm`: COOT's layer norm, ``gain * (x - mean) / (std + 1e-6) + bias`` with the
  *unbiased* standard deviation (not :class:`torch.nn.LayerNorm`'s ``sqrt(var + eps)``).
- :func:`sinusoid_table`: COOT's fixed sine/cosine positions (its formula, which differs from
  "Attention is all you need": dimension ``i`` uses ``10000 ** (2 i / dim)``).
- :class:`ReleaseBlock`: one post-norm encoder layer, ``LN(q + MHA(q, kv))`` -> dropout ->
  ``LN(x + FF(x))``, FF = Linear -> Dropout -> GELU -> Linear -> Dropout of width ``ff``;
  with ``kv`` another sequence it is the context branch's cross-attention.
- :class:`AttentionPool`: COOT's attention-aware feature aggregation ("AF", ``GenPool``): each of
  ``heads`` heads scores every row with a 2-layer MLP and weights its own slice of
  ``dim / heads`` channels, softmax over the rows.
- :func:`init_release`: truncated-normal init, std 0.01, cut at 2 std, of every parameter named
  ``weight`` or ``bias`` (the release's ``init_network``); layer-norm gains stay 1.

Ours, not the release's: padded rows are masked everywhere (attention keys, the pooler's softmax,
the average); the release pads with zeros and masks nothing (COOT masks attention and the
attention pooler, not its average). Several layers chain (the release's loop feeds every layer the
original input, which only matters for more than one layer).
"""

from __future__ import annotations

import torch
from torch import nn

from xmodal._validate import integer, number, positive_int, positive_number

__all__ = ["CootLayerNorm", "sinusoid_table", "ReleaseBlock", "ReleaseEncoder", "AttentionPool", "init_release"]


class CootLayerNorm(nn.Module):
    """COOT's layer norm (``LayerNormalization``, CrossCLR release ``models/model.py`` l. 441-454).

    Shape:
        - x: ``[..., dim]``; output: same shape
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        from xmodal._validate import positive_int, positive_number

        dim, eps = positive_int(dim, "dim"), positive_number(eps, "eps")
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)  # unbiased, as the release
        return self.gain * (x - mean) / (std + self.eps) + self.bias


def sinusoid_table(length: int, dim: int) -> torch.Tensor:
    """COOT's sine/cosine positions ``[length, dim]`` (release ``PositionalEncoding``, l. 518-527).

    >>> t = sinusoid_table(3, 4)
    >>> t[0].tolist(), round(float(t[1, 0]), 4)
    ([0.0, 1.0, 0.0, 1.0], 0.8415)
    """
    length, dim = integer(length, "length", minimum=1), integer(dim, "dim", minimum=1)
    position = torch.arange(length, dtype=torch.float64)[:, None]
    div = 10000.0 ** (2 * torch.arange(dim, dtype=torch.float64) / dim)
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position / div[0::2])
    table[:, 1::2] = torch.cos(position / div[1::2])
    return table.float()


class ReleaseBlock(nn.Module):
    """One post-norm encoder layer (release ``TransformerEncoderLayer`` + ``Sublayer``, l. 558-583).

    Attention is :class:`torch.nn.MultiheadAttention` (the release's ``MultiHeadAttention``: separate
    query/key/value projections, scaled dot product, a final projection, dropout on the weights).

    Shape:
        - query: ``[B, Lq, D]``; kv: ``[B, L, D]`` (``None``: self-attention on ``query``);
          key_padding_mask: ``[B, L]`` bool, True = padded (ignored)
        - output: ``[B, Lq, D]``
    """

    def __init__(self, dim: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        dim, heads, ff = (positive_int(v, n) for v, n in ((dim, "dim"), (heads, "heads"), (ff, "ff")))
        dropout = number(dropout, "dropout", minimum=0.0)
        if dropout >= 1 or dim % heads:
            raise ValueError(f"dropout: must be in [0, 1) and heads ({heads}) must divide dim ({dim})")
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm1 = CootLayerNorm(dim)
        self.drop = nn.Dropout(dropout)
        self.ff = nn.Sequential(nn.Linear(dim, ff), nn.Dropout(dropout), nn.GELU(), nn.Linear(ff, dim),
                                nn.Dropout(dropout))
        self.norm2 = CootLayerNorm(dim)

    def forward(self, query: torch.Tensor, kv: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        kv = query if kv is None else kv
        a = self.attn(query, kv, kv, key_padding_mask=key_padding_mask, need_weights=False)[0]
        x = self.drop(self.norm1(query + a))
        return self.norm2(x + self.ff(x))


class ReleaseEncoder(nn.Module):
    """``layers`` :class:`ReleaseBlock` s of width ``dim`` and feed-forward ``dim`` (the release's
    ``pointwise_ff_dim`` equals the model width), chained."""

    def __init__(self, dim: int, heads: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ReleaseBlock(dim, heads, dim, dropout) for _ in range(layers))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, key_padding_mask=key_padding_mask)
        return x


class AttentionPool(nn.Module):
    """COOT's attention-aware feature aggregation (release ``AtnPool`` l. 658-716; COOT ``GenPool``).

    Head ``h`` maps every row ``x_l`` to ``s_l = W2_h GELU(W1_h x_l + b1_h) + b2_h`` (``dim / heads``
    scores, one per channel of the head's slice) and pools its slice
    ``sum_l softmax_l(s_l) * x_l[h-th slice]``; the heads' slices are concatenated.

    Args:
        dim: the pooled rows' width (divisible by ``heads``).
        hidden: the scoring MLP's total width over all heads (divisible by ``heads``; 0 = ``dim``).
        heads: Table 7 "AF heads".

    Shape:
        - x: ``[B, L, dim]``; mask: ``[B, L]`` bool, True = a real row (None: all real)
        - output: ``[B, dim]``
    """

    def __init__(self, dim: int, hidden: int = 0, heads: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        dim, heads = integer(dim, "dim", minimum=1), integer(heads, "heads", minimum=1)
        hidden = integer(hidden, "hidden", minimum=0) or dim
        number(dropout, "dropout")
        if dim % heads or hidden % heads:
            raise ValueError(f"model.pool_heads: must divide the pooled width {dim} and the pooler's hidden "
                             f"width {hidden}, got {heads}")
        self.heads = heads
        self.w1 = nn.Parameter(torch.zeros(heads, dim, hidden // heads))
        self.b1 = nn.Parameter(torch.zeros(heads, hidden // heads))
        self.w2 = nn.Parameter(torch.zeros(heads, hidden // heads, dim // heads))
        self.b2 = nn.Parameter(torch.zeros(heads, dim // heads))
        self.act = nn.GELU()
        self.drop1, self.drop2, self.drop3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)
        for p in (self.w1, self.b1, self.w2, self.b2):  # the release initialises the pooler itself
            nn.init.trunc_normal_(p, std=0.01, a=-0.02, b=0.02)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, length, dim = x.shape
        s = torch.matmul(x[:, None], self.w1[None]) + self.b1[None, :, None]  # [B, H, L, hidden/H]
        s = self.act(self.drop1(s))
        s = self.drop2(torch.matmul(s, self.w2[None]) + self.b2[None, :, None])  # [B, H, L, dim/H]
        if mask is not None:
            s = s.masked_fill(~mask[:, None, :, None], float("-inf"))
        w = self.drop3(torch.softmax(s, dim=2))
        w = w.transpose(1, 2).reshape(b, length, dim)  # head h weights channels h*dim/H .. (h+1)*dim/H
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)
        return (x * w).sum(1)


@torch.no_grad()
def init_release(module: nn.Module, std: float = 0.01) -> None:
    """The release's ``init_network(net, init_std=0.01)`` (l. 719-726): every parameter whose name
    holds ``weight`` or ``bias`` from a normal of std ``std`` truncated at 2 std. :class:`AttentionPool`
    parameters (``w1`` ...) are left as their constructor drew them, as are layer-norm gains."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    std = positive_number(std, "std")
    for name, p in module.named_parameters():
        last = name.rsplit(".", 1)[-1]
        if "weight" in last or "bias" in last:
            nn.init.trunc_normal_(p, std=std, a=-2 * std, b=2 * std)
