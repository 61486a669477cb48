"""Two-tower heads over pre-extracted features, and checkpoint loading.

A :class:`TwoTower` maps frozen video/image features ``[N, Dv]`` (or ``[N, F, Dv]``
with a frame axis) and text features ``[N, Dt]`` into a joint ``D``-dimensional
space where retrieval is a dot product of L2-normalised embeddings.

Towers (``kind``):
    - ``linear``: one linear map (the frozen-expert baseline of CrossCLR / TS++).
    - ``mlp``: ``depth`` hidden layers of ``width`` units, GELU, dropout, then linear.
    - ``meanp``: CLIP4Clip "meanP": mean over the frame axis, then a linear map.
    - ``transformer``: Cali-NCE style temporal pooling, a small transformer encoder
      (2 layers, 512 hidden, 8 heads) over frames with a learned position
      embedding, mean-pooled (or ``max``: per-channel maximum, the CrossCLR release's LSMDC local
      pooler; or ``atn``: COOT's attention-aware aggregation), then a linear map;
      ``block: release`` is COOT's local transformer (:mod:`~xmodal.models.towers`).
Features without a frame axis pass through ``meanp``/``transformer`` as one frame;
features with a frame axis given to ``linear``/``mlp`` are mean-pooled first.

Input standardisation (per-feature mean/std measured on the training split) is a
buffer of each tower, so it is saved and restored with the weights.

Layout of this package:
    - :mod:`~xmodal.models.towers`: ``TOWER_KINDS``, ``TowerSpec``, ``Standardize``, ``masked_mean``,
      ``masked_max``, ``Tower``
    - :mod:`~xmodal.models.fusion`: ``FUSIONS``, ``ExpertFusion`` (several video experts)
    - :mod:`~xmodal.models.two_tower`: ``TwoTower``, ``build_model``
    - :mod:`~xmodal.models.hierarchy`: ``GlobalSpec``, ``GlobalTower``, ``HierarchicalTwoTower``
      (clips inside videos: CrossCLR appendix A / COOT's global level)
    - :mod:`~xmodal.models.coot`: COOT's blocks as the CrossCLR release builds them
      (``CootLayerNorm``, ``sinusoid_table``, ``ReleaseBlock``, ``AttentionPool``): ``model.block:
      release``, ``atn`` pooling
    - :mod:`~xmodal.models.io`: ``CHECKPOINT_NAMES``, ``model_payload``, ``model_from_payload``, ``load_model``,
      ``model_files``, ``run_config``
    - :mod:`~xmodal.models.export`: the ``xmodal export`` folder (``model.safetensors`` + ``config.json``):
      ``export_state``, ``export_payload``, ``is_export_dir``
    - :mod:`~xmodal.models.onnx_towers`: ``export_onnx``, ``check_onnx`` (the towers as ONNX graphs, extra ``[onnx]``)
"""

from xmodal.models.fusion import FUSIONS, ExpertFusion
from xmodal.models.io import CHECKPOINT_NAMES, checkpoint_file, load_model, model_from_payload, model_payload
from xmodal.models.towers import TOWER_KINDS, Standardize, Tower, TowerSpec, masked_max, masked_mean
from xmodal.models.two_tower import MAIN_EXPERT, TwoTower, build_model, parameter_count
from xmodal.runs import atomic_save, load_checkpoint  # noqa: F401  (former home)

__all__ = ["CHECKPOINT_NAMES", "checkpoint_file", "FUSIONS", "MAIN_EXPERT", "TOWER_KINDS", "ExpertFusion", "Standardize", "Tower",
           "TowerSpec", "TwoTower", "build_model", "load_model", "masked_max", "masked_mean", "model_from_payload",
           "model_payload", "parameter_count"]
