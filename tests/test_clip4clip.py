"""``model.kind: clip4clip`` against a transcription of CLIP4Clip's own code (ArrowLuo/CLIP4Clip,
``modules/modeling.py``: ``_mean_pooling_for_similarity_visual``, the seqTransf branch of
``_loose_similarity`` and the ``frame_position_embeddings`` / ``transformerClip`` initialisation from
CLIP's state dict; ``modules/module_cross.py``: ``ResidualAttentionBlock``, ``Transformer``;
``modules/until_module.py``: the TF-style ``LayerNorm``; ``dataloaders/dataloader_msrvtt_retrieval.py``:
``_get_text`` and the ``slice_framepos`` branch of ``_get_rawvideo``), with the same weights."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from hf_tiny import save_clip

pytest.importorskip("transformers")
SIZE = 16


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return save_clip(tmp_path_factory.mktemp("clip4clip") / "clip", seed=3, image_size=SIZE, projection_dim=32)


# ----------------------------------------------------------------- the transcription (reference)


class RefLayerNorm(nn.Module):  # until_module.LayerNorm: "TF style (epsilon inside the square root)"
    def __init__(self, hidden_size, eps=1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.weight * x + self.bias


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class ResidualAttentionBlock(nn.Module):  # module_cross.py
    def __init__(self, d_model, n_head):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_head)
        self.ln_1 = RefLayerNorm(d_model)
        self.mlp = nn.Sequential(OrderedDict([("c_fc", nn.Linear(d_model, d_model * 4)), ("gelu", QuickGELU()),
                                              ("c_proj", nn.Linear(d_model * 4, d_model))]))
        self.ln_2 = RefLayerNorm(d_model)
        self.n_head = n_head

    def attention(self, x, attn_mask):
        attn_mask_ = attn_mask.repeat_interleave(self.n_head, dim=0)
        return self.attn(x, x, x, need_weights=False, attn_mask=attn_mask_)[0]

    def forward(self, para_tuple):
        x, attn_mask = para_tuple
        x = x + self.attention(self.ln_1(x), attn_mask)
        x = x + self.mlp(self.ln_2(x))
        return (x, attn_mask)


class TransformerClip(nn.Module):
    def __init__(self, width, layers, heads):
        super().__init__()
        self.resblocks = nn.Sequential(*[ResidualAttentionBlock(width, heads) for _ in range(layers)])

    def forward(self, x, attn_mask):
        return self.resblocks((x, attn_mask))[0]


def openai_state_dict(clip) -> dict:
    """The text side of a transformers CLIPModel in OpenAI CLIP's names (what CLIP4Clip reads)."""
    sd = {"positional_embedding": clip.text_model.embeddings.position_embedding.weight.detach().clone()}
    for i, layer in enumerate(clip.text_model.encoder.layers):
        a, p = layer.self_attn, f"transformer.resblocks.{i}."
        sd[p + "attn.in_proj_weight"] = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
        sd[p + "attn.in_proj_bias"] = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach()
        sd[p + "attn.out_proj.weight"], sd[p + "attn.out_proj.bias"] = a.out_proj.weight.detach(), a.out_proj.bias.detach()
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = layer.layer_norm1.weight.detach(), layer.layer_norm1.bias.detach()
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = layer.layer_norm2.weight.detach(), layer.layer_norm2.bias.detach()
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = layer.mlp.fc1.weight.detach(), layer.mlp.fc1.bias.detach()
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = layer.mlp.fc2.weight.detach(), layer.mlp.fc2.bias.detach()
    return sd


class RefHeads(nn.Module):
    """CLIP4Clip's loose-type heads, initialised from ``clip_state_dict`` exactly as ``from_pretrained``."""

    def __init__(self, clip_state_dict, layers, heads):
        super().__init__()
        context_length, width = clip_state_dict["positional_embedding"].shape
        self.frame_position_embeddings = nn.Embedding(context_length, width)
        self.transformerClip = TransformerClip(width=width, layers=layers, heads=heads)
        state_dict = {}
        for key, val in clip_state_dict.items():  # "Initialization trick [HARD CODE]"
            if key == "positional_embedding":
                state_dict["frame_position_embeddings.weight"] = val.clone()
                continue
            if key.find("transformer.resblocks") == 0:
                num_layer = int(key.split(".")[2])
                if num_layer < layers:
                    state_dict[key.replace("transformer.", "transformerClip.")] = val.clone()
                    continue
        self.load_state_dict(state_dict)

    def _mean_pooling_for_similarity_visual(self, visual_output, video_mask):
        video_mask_un = video_mask.to(dtype=torch.float).unsqueeze(-1)
        visual_output = visual_output * video_mask_un
        video_mask_un_sum = torch.sum(video_mask_un, dim=1, dtype=torch.float)
        video_mask_un_sum[video_mask_un_sum == 0.] = 1.
        video_out = torch.sum(visual_output, dim=1) / video_mask_un_sum
        return video_out

    def loose_similarity(self, sequence_output, visual_output, video_mask, sim_header):
        if sim_header == "seqTransf":
            visual_output_original = visual_output
            seq_length = visual_output.size(1)
            position_ids = torch.arange(seq_length, dtype=torch.long, device=visual_output.device)
            position_ids = position_ids.unsqueeze(0).expand(visual_output.size(0), -1)
            frame_position_embeddings = self.frame_position_embeddings(position_ids)
            visual_output = visual_output + frame_position_embeddings
            extended_video_mask = (1.0 - video_mask.unsqueeze(1)) * -1000000.0
            extended_video_mask = extended_video_mask.expand(-1, video_mask.size(1), -1)
            visual_output = visual_output.permute(1, 0, 2)
            visual_output = self.transformerClip(visual_output, extended_video_mask)
            visual_output = visual_output.permute(1, 0, 2)
            visual_output = visual_output + visual_output_original
        visual_output = visual_output / visual_output.norm(dim=-1, keepdim=True)
        visual_output = self._mean_pooling_for_similarity_visual(visual_output, video_mask)
        visual_output = visual_output / visual_output.norm(dim=-1, keepdim=True)
        sequence_output = sequence_output.squeeze(1)
        sequence_output = sequence_output / sequence_output.norm(dim=-1, keepdim=True)
        return torch.matmul(sequence_output, visual_output.t())  # retrieve_logits / logit_scale


def ref_slice(n, max_frames, slice_framepos):  # _get_rawvideo: 0 head, 1 tail, 2 uniform
    raw = np.arange(n)
    if max_frames < raw.shape[0]:
        if slice_framepos == 0:
            return raw[:max_frames, ...]
        if slice_framepos == 1:
            return raw[-max_frames:, ...]
        sample_indx = np.linspace(0, raw.shape[0] - 1, num=max_frames, dtype=int)
        return raw[sample_indx, ...]
    return raw


def ref_get_text(tokenizer, caption, max_words):  # _get_text (CLIP's tokenizer, SOS/EOS specials)
    words = tokenizer.tokenize(caption)
    words = [tokenizer.bos_token] + words
    total_length_with_CLS = max_words - 1
    if len(words) > total_length_with_CLS:
        words = words[:total_length_with_CLS]
    words = words + [tokenizer.eos_token]
    input_ids = tokenizer.convert_tokens_to_ids(words)
    input_mask = [1] * len(input_ids)
    while len(input_ids) < max_words:
        input_ids.append(0)
        input_mask.append(0)
    return np.array(input_ids), np.array(input_mask)


def reference_similarity(clip_dir, frames, mask, captions, *, sim_header, layers, max_frames, frame_pos, max_words):
    """CLIP4Clip's retrieval scores ``[T, V]`` with the CLIP of ``clip_dir`` (loaded on its own)."""
    from transformers import CLIPModel, CLIPProcessor

    clip = CLIPModel.from_pretrained(str(clip_dir)).eval()
    proc = CLIPProcessor.from_pretrained(str(clip_dir))
    pos = {"head": 0, "tail": 1, "uniform": 2}[frame_pos]
    n = frames.shape[0]
    video = np.zeros((n, max_frames, 3, SIZE, SIZE), np.float32)
    video_mask = np.zeros((n, max_frames), np.int64)
    for i in range(n):
        real = np.flatnonzero(mask[i])
        keep = real[ref_slice(len(real), max_frames, pos)]
        imgs = [frames[i, k].reshape(SIZE, SIZE, 3) for k in keep]
        video[i, :len(keep)] = proc.image_processor(images=imgs, return_tensors="np")["pixel_values"]
        video_mask[i, :len(keep)] = 1
    heads = RefHeads(openai_state_dict(clip), layers, clip.text_model.config.num_attention_heads).eval()
    with torch.no_grad():
        pixels = torch.from_numpy(video).view(-1, 3, SIZE, SIZE)
        visual = clip.visual_projection(clip.vision_model(pixel_values=pixels).pooler_output).view(n, max_frames, -1)
        ids = torch.from_numpy(np.stack([ref_get_text(proc.tokenizer, c, max_words)[0] for c in captions]))
        hidden = clip.text_model(input_ids=ids).last_hidden_state  # causal: padding after EOS cannot reach it
        eos = (ids == proc.tokenizer.eos_token_id).int().argmax(-1)  # the CLIP text feature at the EOS token
        sequence = clip.text_projection(hidden[torch.arange(len(ids)), eos])[:, None]
        return heads.loose_similarity(sequence, visual, torch.from_numpy(video_mask), sim_header)


def ours(clip_dir, frames, mask, captions, **kw):
    from xmodal.models.clip4clip import build_clip4clip, tokenize

    model, proc = build_clip4clip(f"hf:{clip_dir}", **kw)
    ids = tokenize(captions, proc.tokenizer, kw["max_words"])
    text = model.encode_text(ids)
    video = model.encode_video(frames, mask)
    return text @ video.T, model


def _inputs(seed=0, n=5, f=9):
    g = np.random.default_rng(seed)
    frames = g.integers(0, 256, size=(n, f, SIZE * SIZE * 3), dtype=np.uint8)
    flat = g.integers(0, 256, size=(n, f, 1, 3), dtype=np.uint8)  # every other frame one colour: unequal norms
    frames[:, ::2] = np.broadcast_to(flat, (n, f, SIZE * SIZE, 3)).reshape(n, f, -1)[:, ::2]
    lengths = [f, 1, 4, 7, 3][:n]
    mask = np.arange(f)[None] < np.array(lengths)[:, None]
    mask[2] = np.array([1, 0, 1, 1, 0, 0, 1, 0, 0], bool)  # real frames need not be a prefix
    captions = ["a red ball moves left", "blue", "a green square slides up and down the frame again and again",
                "x", "two shapes"]
    return frames, mask, captions


@pytest.mark.parametrize("sim_header,frame_pos,max_frames", [("meanP", "head", 12), ("meanP", "uniform", 4),
                                                             ("seqTransf", "head", 12), ("seqTransf", "uniform", 4),
                                                             ("seqTransf", "tail", 5)])
def test_similarity_equals_clip4clip(clip_dir, sim_header, frame_pos, max_frames):
    frames, mask, captions = _inputs()
    kw = dict(sim_header=sim_header, temporal_layers=2, max_frames=max_frames, frame_pos=frame_pos, max_words=10)
    got, _ = ours(clip_dir, frames, mask, captions, **kw)
    ref = reference_similarity(clip_dir, frames, mask, captions, sim_header=sim_header, layers=2,
                               max_frames=max_frames, frame_pos=frame_pos, max_words=10)
    assert got.shape == ref.shape == (5, 5)
    assert torch.allclose(got, ref.float(), atol=1e-5, rtol=0), (got - ref).abs().max()


def test_seqtransf_is_not_meanp(clip_dir):
    """The reference can fail: seqTransf scores differ from meanP's (the test above sees the header)."""
    frames, mask, captions = _inputs(1)
    a, _ = ours(clip_dir, frames, mask, captions, sim_header="meanP", max_frames=12, frame_pos="head", max_words=10)
    b, _ = ours(clip_dir, frames, mask, captions, sim_header="seqTransf", temporal_layers=2, max_frames=12,
                frame_pos="head", max_words=10)
    assert (a - b).abs().max() > 1e-3


def test_initialisation_from_clip(clip_dir):
    from transformers import CLIPModel

    clip = CLIPModel.from_pretrained(str(clip_dir))
    _, model = ours(clip_dir, *_inputs()[:2], ["a"], sim_header="seqTransf", temporal_layers=1, max_frames=12,
                    frame_pos="head", max_words=10)
    head = model.video_tower.temporal
    assert torch.equal(head.position.weight, clip.text_model.embeddings.position_embedding.weight)
    assert len(head.blocks) == 1
    ref = clip.text_model.encoder.layers[0].state_dict()
    for k, v in head.blocks[0].state_dict().items():
        assert torch.equal(v, ref[k]), k
    assert all(m.eps == 1e-12 for m in head.modules() if isinstance(m, nn.LayerNorm))
    # the head is a copy: training it leaves CLIP's text transformer alone
    assert head.blocks[0].mlp.fc1.weight.data_ptr() != model.text_tower.text_model.encoder.layers[0].mlp.fc1.weight.data_ptr()


def test_frame_positions_equal_slice_framepos():
    from xmodal.models.clip4clip import frame_positions

    for n in range(1, 40):
        for mf in (1, 4, 12):
            for pos, code in (("head", 0), ("tail", 1), ("uniform", 2)):
                assert frame_positions(n, mf, pos).tolist() == ref_slice(n, mf, code).tolist(), (n, mf, pos)


def test_tokenize_equals_get_text(clip_dir):
    from transformers import CLIPProcessor

    from xmodal.models.clip4clip import tokenize

    tok = CLIPProcessor.from_pretrained(str(clip_dir)).tokenizer
    caps = ["a", "a red ball", "a much longer caption that will certainly be cut at max words"]
    ids = tokenize(caps, tok, 8)
    for row, c in zip(ids, caps):
        ref_ids, ref_mask = ref_get_text(tok, c, 8)
        assert (row >= 0).tolist() == ref_mask.astype(bool).tolist()
        assert np.where(row >= 0, row, 0).tolist() == ref_ids.tolist()


def test_padded_frames_change_nothing(clip_dir):
    frames, mask, captions = _inputs(2)
    junk = frames.copy()
    junk[~mask] = 255 - junk[~mask]
    a, _ = ours(clip_dir, frames, mask, captions, sim_header="seqTransf", temporal_layers=2, max_frames=12,
                frame_pos="head", max_words=10)
    b, _ = ours(clip_dir, junk, mask, captions, sim_header="seqTransf", temporal_layers=2, max_frames=12,
                frame_pos="head", max_words=10)
    assert torch.allclose(a, b, atol=1e-6)


def test_freeze_layers_as_clip4clip(clip_dir):
    from xmodal.models.clip4clip import build_clip4clip

    model, _ = build_clip4clip(f"hf:{clip_dir}", sim_header="seqTransf", temporal_layers=1, freeze_layers=1,
                               max_words=16)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert "video_tower.vision_model.embeddings.patch_embedding.weight" in frozen
    assert "text_tower.text_model.embeddings.token_embedding.weight" in frozen
    assert "video_tower.vision_model.pre_layrnorm.weight" in frozen  # CLIP's ln_pre
    assert any(n.startswith("video_tower.vision_model.encoder.layers.0.") for n in frozen)
    assert not any(".encoder.layers.1." in n for n in frozen)
    for kept in ("video_tower.vision_model.post_layernorm.weight", "video_tower.visual_projection.weight",
                 "text_tower.text_model.final_layer_norm.weight", "text_tower.text_projection.weight",
                 "video_tower.temporal.blocks.0.mlp.fc1.weight"):
        assert kept not in frozen
    everything, _ = build_clip4clip(f"hf:{clip_dir}", freeze_layers=-1, max_words=16)
    assert all(p.requires_grad for p in everything.parameters())


def test_bad_encoder_is_one_line(tmp_path):
    from xmodal.models.clip4clip import build_clip4clip

    with pytest.raises(ValueError, match="model.encoder: expected hf:DIR"):
        build_clip4clip("minilm")
    with pytest.raises(ValueError, match="no config.json"):
        build_clip4clip(f"hf:{tmp_path}")


def test_seqtransf_needs_matching_widths(tmp_path):
    from xmodal.models.clip4clip import build_clip4clip

    folder = save_clip(tmp_path / "c", image_size=SIZE)  # projection 24, text width 32
    with pytest.raises(ValueError, match="model.sim_header: seqTransf"):
        build_clip4clip(f"hf:{folder}", sim_header="seqTransf", temporal_layers=1, max_words=16)


def test_tighttransf_is_refused_in_one_line(clip_dir, tmp_path, capsys):
    """CLIP4Clip's tight type scores pairs with a cross transformer and embeds neither side: the config check,
    the library and ``xmodal train`` refuse it in the same one line, before any weight is loaded."""
    from xmodal.cli import main
    from xmodal.config import from_dict
    from xmodal.models.clip4clip import TIGHT_REFUSED, build_clip4clip

    assert TIGHT_REFUSED.startswith("model.sim_header: tightTransf") and "\n" not in TIGHT_REFUSED
    with pytest.raises(ValueError) as got:
        from_dict({"model": {"kind": "clip4clip", "encoder": f"hf:{clip_dir}", "sim_header": "tightTransf"}})
    assert str(got.value) == TIGHT_REFUSED
    with pytest.raises(ValueError) as got:
        build_clip4clip(f"hf:{clip_dir}", sim_header="tightTransf", max_words=16)
    assert str(got.value) == TIGHT_REFUSED
    assert "Loading weights" not in capsys.readouterr().err  # refused before the weights load
    assert main(["train", "configs/clip4clip/meanp.yaml", "--out", str(tmp_path / "run"), f"model.encoder=hf:{clip_dir}",
                 "model.sim_header=tightTransf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and TIGHT_REFUSED in err[0]
    assert not (tmp_path / "run").exists()


def test_payload_round_trip(clip_dir):
    from xmodal.models.io import model_from_payload, model_payload

    frames, mask, captions = _inputs()
    sim, model = ours(clip_dir, frames, mask, captions, sim_header="seqTransf", temporal_layers=2, max_frames=4,
                      frame_pos="uniform", max_words=10)
    from xmodal.models.clip4clip import tokenize
    from transformers import CLIPProcessor

    again = model_from_payload(model_payload(model))
    ids = tokenize(captions, CLIPProcessor.from_pretrained(str(clip_dir)).tokenizer, 10)
    assert torch.equal(again.encode_text(ids) @ again.encode_video(frames, mask).T, sim)


def test_sample_frames_equals_a_per_video_loop():
    """The vectorised sampling equals a per-video loop over each video's real frames (CLIP4Clip's
    ``_get_rawvideo`` positions, :func:`frame_positions`), masks with gaps and all three ``frame_pos``."""
    from xmodal.models.clip4clip import frame_positions, sample_frames

    def loop(frames, mask, max_frames, frame_pos):
        n, f = frames.shape[:2]
        index = torch.zeros(n, min(f, max_frames), dtype=torch.long)
        out = torch.zeros(n, min(f, max_frames), dtype=torch.bool)
        for i in range(n):
            rows = [j for j in range(f) if mask[i, j]]
            for k, p in enumerate(frame_positions(len(rows), max_frames, frame_pos)):
                index[i, k], out[i, k] = rows[p], True
        return torch.stack([frames[i, index[i]] for i in range(n)]), out

    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        n, f, mf = (int(torch.randint(1, hi, (1,), generator=g)) for hi in (9, 15, 13))
        frames = torch.randint(0, 255, (n, f, 5), generator=g).to(torch.uint8)
        mask = torch.rand(n, f, generator=g) > 0.3
        for frame_pos in ("head", "tail", "uniform"):
            got, want = sample_frames(frames, mask, mf, frame_pos), loop(frames, mask, mf, frame_pos)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
