"""COOT's modules (xmodal.models.coot, the ``release`` block, atn pooling, the context branch)
against a small literal transcription of the public CrossCLR release, which carries COOT's model code:
github amazon-science/crossmodal-contrastive-learning, ``models/model.py`` (commit 060674e), line
numbers cited per class. The transcription is the release's computation, unmasked (the release
masks nothing); masking is checked by running it on each sequence without its padding. Forwards
in float64 on fixed weights copied from xmodal's modules.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from xmodal.models.coot import AttentionPool, CootLayerNorm, init_release, sinusoid_table
from xmodal.models.hierarchy import GlobalSpec, GlobalTower, group_frames, with_global_towers
from xmodal.models.towers import Tower, TowerSpec

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------- the release, transcribed (no masks)


class RefLayerNorm(nn.Module):  # models/model.py l. 441-454
    def __init__(self, features_count, epsilon=1e-6):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(features_count))
        self.bias = nn.Parameter(torch.zeros(features_count))
        self.epsilon = epsilon

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        std = x.std(dim=-1, keepdim=True)
        return self.gain * (x - mean) / (std + self.epsilon) + self.bias


class RefPositionalEncoding(nn.Module):  # l. 518-536
    def __init__(self, dim, dropout_prob=0., max_len=1000):
        super().__init__()
        pe = torch.zeros(max_len, dim).float()
        position = torch.arange(0, max_len).unsqueeze(1).float()
        dimension = torch.arange(0, dim).float()
        div_term = 10000 ** (2 * dimension / dim)
        pe[:, 0::2] = torch.sin(position / div_term[0::2])
        pe[:, 1::2] = torch.cos(position / div_term[1::2])
        self.register_buffer('pe', pe)
        self.dropout = nn.Dropout(p=dropout_prob)

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(1), :])


class RefMultiHeadAttention(nn.Module):  # l. 586-635
    def __init__(self, heads_count, model_dim):
        super().__init__()
        self.d_head = model_dim // heads_count
        self.heads_count = heads_count
        self.query_projection = nn.Linear(model_dim, heads_count * self.d_head)
        self.key_projection = nn.Linear(model_dim, heads_count * self.d_head)
        self.value_projection = nn.Linear(model_dim, heads_count * self.d_head)
        self.final_projection = nn.Linear(model_dim, heads_count * self.d_head)

    def forward(self, query, key, value):
        batch_size, query_len, model_dim = query.size()
        d_head = model_dim // self.heads_count
        q = self.query_projection(query).view(batch_size, query_len, self.heads_count, d_head).transpose(1, 2)
        k = self.key_projection(key).view(batch_size, key.shape[1], self.heads_count, d_head).transpose(1, 2)
        v = self.value_projection(value).view(batch_size, value.shape[1], self.heads_count, d_head).transpose(1, 2)
        attention_weights = torch.matmul(q, k.transpose(2, 3)) / np.sqrt(self.d_head)
        attention = torch.softmax(attention_weights, dim=3)
        context = torch.matmul(attention, v).transpose(1, 2).reshape(batch_size, query_len, model_dim)
        return self.final_projection(context)


class RefFeedForward(nn.Module):  # l. 638-647 (dropout 0)
    def __init__(self, fc_dim, model_dim):
        super().__init__()
        self.feed_forward = nn.Sequential(nn.Linear(model_dim, fc_dim), nn.Dropout(0.0), nn.GELU(),
                                          nn.Linear(fc_dim, model_dim), nn.Dropout(0.0))

    def forward(self, x):
        return self.feed_forward(x)


class RefSublayer(nn.Module):  # l. 574-583
    def __init__(self, sublayer, model_dim):
        super().__init__()
        self.sublayer = sublayer
        self.layer_normalization = RefLayerNorm(model_dim)

    def forward(self, *args):
        x = args[0]
        x = self.sublayer(*args) + x
        return self.layer_normalization(x)


class RefEncoderLayer(nn.Module):  # l. 558-571
    def __init__(self, model_dim, heads_count, fc_dim):
        super().__init__()
        self.self_attention_layer = RefSublayer(RefMultiHeadAttention(heads_count, model_dim), model_dim)
        self.pointwise_feedforward_layer = RefSublayer(RefFeedForward(fc_dim, model_dim), model_dim)

    def forward(self, query, key, value):
        return self.pointwise_feedforward_layer(self.self_attention_layer(query, key, value))


class RefEncoder(nn.Module):  # l. 539-555 (one layer: the release's loop reuses the input query)
    def __init__(self, model_dim, heads_count, fc_dim):
        super().__init__()
        self.encoder_layers = nn.ModuleList([RefEncoderLayer(model_dim, heads_count, fc_dim)])

    def forward(self, query, key, value):
        sources = None
        for encoder_layer in self.encoder_layers:
            sources = encoder_layer(query, key, value)
        return sources


class RefAtnPool(nn.Module):  # l. 658-716 (dropout 0)
    def __init__(self, d_input, d_attn, n_heads):
        super().__init__()
        self.d_head = d_attn // n_heads
        self.d_head_output = d_input // n_heads
        self.genpool_w1_head = nn.Parameter(torch.zeros(n_heads, d_input, self.d_head))
        self.genpool_b1_head = nn.Parameter(torch.zeros(n_heads, self.d_head))
        self.genpool_w2_head = nn.Parameter(torch.zeros(n_heads, self.d_head, self.d_head_output))
        self.genpool_b2_head = nn.Parameter(torch.zeros(n_heads, self.d_head_output))
        self.activation = nn.GELU()

    def forward(self, features):
        batch_size, seq_len, input_dim = features.shape
        b1 = torch.matmul(features.unsqueeze(1), self.genpool_w1_head.unsqueeze(0))
        b1 += self.genpool_b1_head.unsqueeze(1).unsqueeze(0)
        b1 = self.activation(b1)
        b1 = torch.matmul(b1, self.genpool_w2_head.unsqueeze(0))
        b1 += self.genpool_b2_head.unsqueeze(1).unsqueeze(0)
        smweights = torch.softmax(b1, dim=2)
        smweights = smweights.transpose(1, 2).reshape(-1, seq_len, input_dim)
        return (features * smweights).sum(dim=1)


class RefTransformer(nn.Module):  # l. 471-516, pooler from parse_pooler l. 457-468 (avg l. 649, max l. 653)
    def __init__(self, feature_dim, input_fc_dim, heads, pooler, use_context=False, atn_hidden=0, atn_heads=1):
        super().__init__()
        self.input_norm = RefLayerNorm(feature_dim)
        self.input_fc = None
        input_dim = feature_dim
        if input_fc_dim:
            self.input_fc = nn.Sequential(nn.Linear(feature_dim, input_fc_dim), nn.GELU())
            input_dim = input_fc_dim
        self.embedding = RefPositionalEncoding(input_dim, 0.0, max_len=1000)
        self.tf = RefEncoder(input_dim, heads, input_dim)
        if use_context:
            self.ctx_project = nn.Sequential(nn.Linear(input_dim, input_dim), nn.GELU())
            self.tf_context = RefEncoder(input_dim, heads, input_dim)
        self.pooler_name = pooler
        if pooler == "atn":
            self.pooler = RefAtnPool(input_dim, atn_hidden or input_dim, atn_heads)

    def pool(self, features):
        if self.pooler_name == "avg":
            return torch.mean(features, dim=1)
        if self.pooler_name == "max":
            return torch.max(features, dim=1)[0]
        return self.pooler(features)

    def forward(self, features, hidden_state=None, use_context=False):
        features = self.input_norm(features)
        if self.input_fc is not None:
            features = self.input_fc(features)
        features = self.embedding(features)
        features = self.tf(features, features, features)
        add_after_pool = None
        if use_context:
            hidden_state = hidden_state.unsqueeze(1)
            hidden_state = self.ctx_project(hidden_state)
            ctx = self.tf_context(hidden_state, features, features)
            add_after_pool = ctx.squeeze(1)
        pooled = self.pool(features)
        if add_after_pool is not None:
            pooled = torch.cat([pooled, add_after_pool], dim=-1)
        return pooled


# ------------------------------------------------------------- copying xmodal's weights into it


def _copy_norm(ours, ref):
    ref.gain.data.copy_(ours.gain)
    ref.bias.data.copy_(ours.bias)


def _copy_block(ours, ref: RefEncoderLayer):
    """xmodal ReleaseBlock (nn.MultiheadAttention + CootLayerNorm) -> the release's layer."""
    mha = ref.self_attention_layer.sublayer
    w, b = ours.attn.in_proj_weight.chunk(3), ours.attn.in_proj_bias.chunk(3)
    for lin, wi, bi in zip((mha.query_projection, mha.key_projection, mha.value_projection), w, b):
        lin.weight.data.copy_(wi)
        lin.bias.data.copy_(bi)
    mha.final_projection.weight.data.copy_(ours.attn.out_proj.weight)
    mha.final_projection.bias.data.copy_(ours.attn.out_proj.bias)
    _copy_norm(ours.norm1, ref.self_attention_layer.layer_normalization)
    ff = ref.pointwise_feedforward_layer.sublayer.feed_forward
    for i in (0, 3):
        ff[i].weight.data.copy_(ours.ff[i].weight)
        ff[i].bias.data.copy_(ours.ff[i].bias)
    _copy_norm(ours.norm2, ref.pointwise_feedforward_layer.layer_normalization)


def _copy_pool(ours: AttentionPool, ref: RefAtnPool):
    for a, b in (("w1", "genpool_w1_head"), ("b1", "genpool_b1_head"), ("w2", "genpool_w2_head"),
                 ("b2", "genpool_b2_head")):
        getattr(ref, b).data.copy_(getattr(ours, a))


def _jitter(module: nn.Module, seed: int) -> None:
    """Fixed, non-trivial weights: the release's std 0.01 init makes every output nearly flat."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _lengths_mask(lengths, width):
    return torch.arange(width)[None, :] < torch.as_tensor(lengths)[:, None]


# ------------------------------------------------------------- tests


def test_layer_norm_and_positions_are_the_release_formulas():
    x = torch.randn(4, 7, dtype=torch.float64)
    ours, ref = CootLayerNorm(7).double(), RefLayerNorm(7).double()
    _jitter(ours, 0)
    _copy_norm(ours, ref)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-12)
    assert not torch.allclose(ours(x), nn.functional.layer_norm(x, (7,), ours.gain, ours.bias, 1e-6))
    torch.testing.assert_close(sinusoid_table(50, 10), RefPositionalEncoding(10, max_len=50).pe)
    torch.testing.assert_close(sinusoid_table(50, 9), RefPositionalEncoding(9, max_len=50).pe)  # odd width


@pytest.mark.parametrize("heads, hidden", [(1, 0), (2, 0), (2, 12), (4, 16)])
def test_attention_pool_heads_split_the_channels_like_the_release(heads, hidden):
    torch.manual_seed(1)
    ours = AttentionPool(8, hidden, heads).double().eval().requires_grad_(False)
    _jitter(ours, 1)
    ref = RefAtnPool(8, hidden or 8, heads).double()
    _copy_pool(ours, ref)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    lengths = [5, 2, 3]
    mask = _lengths_mask(lengths, 5)
    junk = x.masked_fill(~mask[..., None], 1e6)
    out = ours(junk, mask)
    assert out.shape == (3, 8)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(out[i], ref(x[i:i + 1, :n])[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-12)  # no mask = all real
    # a plain loop over heads, channels and rows: head h's scores weight only its slice of channels
    dh = 8 // heads
    for b in range(3):
        for h in range(heads):
            rows = x[b, :lengths[b]]
            s = nn.functional.gelu(rows @ ours.w1[h] + ours.b1[h]) @ ours.w2[h] + ours.b2[h]  # [L, dh]
            for c in range(dh):
                w = torch.softmax(s[:, c], 0)
                want = sum(w[l] * rows[l, h * dh + c] for l in range(lengths[b]))
                assert abs(float(out[b, h * dh + c] - want)) < 1e-12


@pytest.mark.parametrize("pooling, ref_pool", [("atn", "atn"), ("mean", "avg"), ("max", "max")])
def test_release_local_tower_against_the_release_transformer(pooling, ref_pool):
    # max: the release's LSMDC local level (config/lsmdc.yaml video_local pooler_config name max; Table 7
    # LSMDC "Pooler Max"), the release's MaxPool l. 653-656
    torch.manual_seed(2)
    spec = TowerSpec(kind="transformer", in_dim=6, out_dim=8, hidden=8, heads=2, layers=1, block="release",
                     pooling=pooling, pool_heads=2, pool_hidden=12, max_frames=10)
    tower = Tower(spec).double().eval()
    _jitter(tower, 2)
    ref = RefTransformer(6, 8, 2, ref_pool, atn_hidden=12, atn_heads=2).double().eval()
    _copy_norm(tower.input_norm, ref.input_norm)
    ref.input_fc[0].weight.data.copy_(tower.inp[0].weight)
    ref.input_fc[0].bias.data.copy_(tower.inp[0].bias)
    _copy_block(tower.encoder.layers[0], ref.tf.encoder_layers[0])
    if pooling == "atn":
        _copy_pool(tower.pool, ref.pooler)
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    lengths = [5, 2, 3]
    mask = _lengths_mask(lengths, 5)
    with torch.no_grad():
        out = tower(x.masked_fill(~mask[..., None], 1e5), mask)
        assert out.shape == (3, 8)
        for i, n in enumerate(lengths):  # the release on each clip's real frames only
            torch.testing.assert_close(out[i], ref(x[i:i + 1, :n])[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(tower(x[:, :4]), ref(x[:, :4]), rtol=0, atol=1e-6)
    assert not any(k.startswith("net.") for k in tower.state_dict())  # no output Linear


@pytest.mark.parametrize("pooling, ref_pool", [("mean", "avg"), ("max", "max"), ("atn", "atn")])
def test_release_global_tower_with_context_against_the_release(pooling, ref_pool):
    torch.manual_seed(3)
    spec = GlobalSpec(dim=8, heads=2, layers=1, pooling=pooling, pool_heads=2, context=True, block="release")
    tower = GlobalTower(spec).double().eval()
    _jitter(tower, 3)
    ref = RefTransformer(8, 0, 2, ref_pool, use_context=True, atn_heads=2).double().eval()
    _copy_norm(tower.input_norm, ref.input_norm)
    _copy_block(tower.encoder.layers[0], ref.tf.encoder_layers[0])
    ref.ctx_project[0].weight.data.copy_(tower.ctx_project[0].weight)
    ref.ctx_project[0].bias.data.copy_(tower.ctx_project[0].bias)
    _copy_block(tower.ctx_attend, ref.tf_context.encoder_layers[0])
    if pooling == "atn":
        _copy_pool(tower.pool, ref.pooler)
    lengths = [4, 1, 2]
    mask = _lengths_mask(lengths, 4)
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    ctx = torch.randn(3, 8, dtype=torch.float64)
    with torch.no_grad():
        out = tower(x.masked_fill(~mask[..., None], -1e5), mask, ctx)
        assert out.shape == (3, 16) and spec.out_dim == 16
        for i, n in enumerate(lengths):
            want = ref(x[i:i + 1, :n], ctx[i:i + 1], use_context=True)[0]
            torch.testing.assert_close(out[i], want, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="context"):
        tower(x, mask)


def test_local_max_pooling_against_a_loop_and_in_the_xmodal_block():
    from xmodal.models import masked_max

    rng = np.random.default_rng(8)
    x = torch.as_tensor(rng.normal(size=(4, 5, 3)))
    lengths = [5, 1, 3, 0]
    mask = _lengths_mask(lengths, 5)
    out = masked_max(x.masked_fill(~mask[..., None], 1e9), mask)
    for i, n in enumerate(lengths):
        for c in range(3):
            want = max(float(x[i, f, c]) for f in range(n)) if n else 0.0  # a row without frames: 0
            assert float(out[i, c]) == want
    torch.testing.assert_close(masked_max(x, None), x.amax(1), rtol=0, atol=0)
    with pytest.raises(ValueError, match="mask"):
        masked_max(x, mask[:, :4])
    with pytest.raises(TypeError, match="mask"):
        masked_max(x, mask.long())
    # the xmodal block pools max before its output Linear: padded frames cannot change an output
    torch.manual_seed(8)
    tower = Tower(TowerSpec(kind="transformer", in_dim=3, out_dim=4, hidden=8, heads=2, layers=1,
                            pooling="max")).double().eval()
    m = mask.clone()
    m[3, 0] = True
    with torch.no_grad():
        full = tower(x.masked_fill(~m[..., None], -7.0), m)
        for i in range(4):
            n = int(m[i].sum())
            torch.testing.assert_close(full[i], tower(x[i:i + 1, :n])[0], rtol=0, atol=1e-12)
        h = tower.encoder(tower.inp(tower.standardize(x[:1])) + tower.pos[:5])
        torch.testing.assert_close(full[0], tower.net(h.amax(1))[0], rtol=0, atol=1e-12)


def test_release_init_is_truncated_normal_and_keeps_gains():
    torch.manual_seed(4)
    tower = GlobalTower(GlobalSpec(dim=64, heads=4, context=True, block="release"))
    tower.requires_grad_(False)
    w = tower.encoder.layers[0].attn.in_proj_weight
    # N(0, 0.01^2) cut at 2 std: std 0.01 * sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)) = 0.0088
    assert float(w.abs().max()) <= 0.02 and abs(float(w.std()) - 0.0088) < 0.001
    assert float(tower.encoder.layers[0].ff[0].bias.abs().max()) <= 0.02
    assert torch.equal(tower.encoder.layers[0].norm1.gain, torch.ones(64))
    lin = nn.Linear(64, 64).requires_grad_(False)
    init_release(lin, std=0.5)
    assert float(lin.weight.abs().max()) <= 1.0


def test_group_frames_against_a_loop_with_subsampling():
    rng = np.random.default_rng(5)
    x = torch.as_tensor(rng.normal(size=(7, 3, 2)))
    mask = torch.as_tensor(rng.random((7, 3)) < 0.7)
    mask[:, 0] = True
    owner = torch.tensor([0, 0, 1, 1, 1, 2, 0])
    for cap in (None, 4, 2):
        seq, m = group_frames(x, mask, owner, 3, cap)
        for g in range(3):
            frames = [x[r, f] for r in range(7) if owner[r] == g for f in range(3) if mask[r, f]]
            n = len(frames)
            if cap is not None and n > cap:
                frames = [frames[(j * n) // cap] for j in range(cap)]
            assert int(m[g].sum()) == len(frames) and bool(m[g, :len(frames)].all())
            torch.testing.assert_close(seq[g, :len(frames)], torch.stack(frames), rtol=0, atol=0)
    seq, m = group_frames(x[:, 0], None, owner, 3)  # one vector per row: a row is one frame
    torch.testing.assert_close(seq[1, :3], x[2:5, 0], rtol=0, atol=0)


def test_context_is_the_local_tower_over_the_whole_video():
    from xmodal.models import build_model

    torch.manual_seed(6)
    flat = build_model(video_dim=5, text_dim=4, kind="transformer", dim=8, hidden=8, heads=2, layers=1,
                       block="release", local_pooling="atn", pool_heads=2)
    model = with_global_towers(flat, GlobalSpec(dim=8, heads=2, context=True, block="release")).eval()
    x = torch.randn(5, 3, 5)
    mask = torch.ones(5, 3, dtype=torch.bool)
    mask[1, 2] = False
    t = torch.randn(6, 4)
    clip_g, text_g = torch.tensor([0, 0, 0, 1, 1]), torch.tensor([0, 0, 1, 1, 1, 1])
    with torch.no_grad():
        vc, tc = model.forward_context(x, mask, clip_g, t, None, text_g, 2)
        whole = torch.cat([x[0], x[1, :2], x[2]])[None]  # video 0: its clips' real frames in order
        torch.testing.assert_close(vc[0], model.video_tower(whole)[0])
        torch.testing.assert_close(tc[1], model.text_tower(t[2:][None])[0])
        p, v, _ = model.encode_groups(x, mask, t, torch.tensor([0, 1, 2, 3, 4, 4]), clip_g)
    assert p.shape == v.shape == (2, 16)


def test_xmodal_block_with_context_maps_back_to_dim_and_masks():
    torch.manual_seed(7)
    tower = GlobalTower(GlobalSpec(dim=8, heads=2, pooling="mean", context=True)).eval()
    x, ctx = torch.randn(2, 3, 8), torch.randn(2, 8)
    mask = _lengths_mask([3, 1], 3)
    with torch.no_grad():
        out = tower(x.masked_fill(~mask[..., None], 9.0), mask, ctx)
        one = tower(x[1:, :1], torch.ones(1, 1, dtype=torch.bool), ctx[1:])
    assert out.shape == (2, 8)
    torch.testing.assert_close(out[1:], one, rtol=1e-5, atol=1e-6)


def test_release_block_needs_hidden_equal_dim_and_atn_heads_divide():
    with pytest.raises(ValueError, match="hidden"):
        Tower(TowerSpec(kind="transformer", in_dim=4, out_dim=8, hidden=16, heads=2, block="release"))
    with pytest.raises(ValueError, match="pool_heads"):
        Tower(TowerSpec(kind="transformer", in_dim=4, out_dim=8, hidden=8, heads=2, pooling="atn", pool_heads=3))
    with pytest.raises(ValueError, match="model.global_pooling"):
        GlobalTower(GlobalSpec(dim=8, heads=2, pooling="avg"))


def test_doctests_of_the_coot_module():
    import doctest

    import xmodal.models.coot
    import xmodal.models.towers

    for mod in (xmodal.models.coot, xmodal.models.towers):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_config_keys_of_the_two_levels_are_checked_and_reach_the_model():
    from xmodal.config import from_dict
    from xmodal.training.hierarchy import global_spec
    from xmodal.training.parts import make_optimizer

    with pytest.raises(ValueError, match="model.pooling: renamed; use model.global_pooling"):
        from_dict({"model": {"pooling": "atn"}})
    with pytest.raises(ValueError, match="model.local_pooling: atn pools a transformer"):
        from_dict({"model": {"local_pooling": "atn"}})
    with pytest.raises(ValueError, match="model.local_pooling: max pools a transformer"):
        from_dict({"model": {"local_pooling": "max"}})
    with pytest.raises(ValueError, match="model.local_pooling: unknown value 'avg'"):
        from_dict({"model": {"kind": "transformer", "local_pooling": "avg"}})
    with pytest.raises(ValueError, match="model.hidden: the release block"):
        from_dict({"model": {"kind": "transformer", "block": "release", "hidden": 512, "dim": 256}})
    with pytest.raises(ValueError, match="model.pool_heads"):
        from_dict({"model": {"kind": "transformer", "local_pooling": "atn", "pool_heads": 3}})
    with pytest.raises(ValueError, match="model.global_pooling"):
        from_dict({"model": {"global_pooling": "avg"}})
    with pytest.raises(ValueError, match="optim.eps"):
        from_dict({"optim": {"eps": 0.0}})
    cfg = from_dict({"model": {"hierarchy": True, "dim": 16, "global_heads": 2, "global_pooling": "atn",
                               "pool_heads": 4, "pool_hidden": 8, "global_context": False, "block": "release"},
                     "optim": {"name": "radam", "betas": [0.56, 0.98], "eps": 1.5e-9}})
    assert global_spec(cfg) == GlobalSpec(dim=16, heads=2, layers=1, dropout=0.0, pooling="atn", pool_heads=4,
                                          pool_hidden=8, context=False, block="release")
    group = make_optimizer(cfg, [nn.Parameter(torch.zeros(2))]).param_groups[0]
    assert (group["betas"], group["eps"]) == ((0.56, 0.98), 1.5e-9)


def test_local_max_pooling_reaches_both_towers_and_trains(tmp_path):
    """LSMDC as the release builds it (config/lsmdc.yaml): local transformers pool max, the global
    level averages; the key reaches the video and the text transformer and a run trains and reloads."""
    from xmodal.config import from_dict
    from xmodal.data import synthetic
    from xmodal.models import load_model
    from xmodal.training import fit

    cfg = from_dict({"data": {"name": "synthetic"},
                     "model": {"kind": "transformer", "text_kind": "transformer", "dim": 8, "hidden": 8, "heads": 2,
                               "layers": 1, "block": "release", "local_pooling": "max", "hierarchy": True,
                               "global_heads": 2, "global_pooling": "mean"},
                     "optim": {"warmup_unit": "epoch", "warmup_epochs": 1},
                     "test_time": {"normalizers": ["none"], "bank_size": 20},
                     "train": {"epochs": 1, "batch_size": 4, "progress": False, "device": "cpu"}})
    s = synthetic(num_train=48, num_val=24, num_test=24, frames=3, clips_per_group=4, seed=0)
    model, _ = fit(cfg, splits={"train": s["train"], "val": s["val"]}, out=tmp_path / "run")
    assert model.video_tower.spec.pooling == model.text_tower.spec.pooling == "max"
    assert model.global_spec.pooling == "mean"
    assert load_model(tmp_path / "run").video_tower.spec.pooling == "max"
