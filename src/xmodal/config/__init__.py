"""Run configuration: frozen dataclasses loaded from YAML, overridden by CLI flags.

The config object stops at the CLI/trainer boundary (house style rule 5): the
trainer turns it into explicit keyword arguments for models, losses, schedules and
normalisers. The resolved config is saved as ``config.yaml`` in the run directory
and round-trips through :func:`load_config`.

Overrides are ``section.key=value`` strings; ``value`` is parsed as YAML
(``loss.name=ncl``, ``optim.lr=3e-4``, ``test_time.normalizers=[none,dn]``,
``loss.kwargs.queue_size=4096``).

This package's ``__init__`` is the schema; :mod:`xmodal.config.doc` renders it as the commented YAML of
``xmodal config`` and ``docs/config.md``. May import: losses, normalize and ``xmodal.data.layout`` (their
declarations only); never training, retrieval, reporting or the CLI.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

import yaml

KNOWN_LOSSES = ("infonce", "ntxent", "maxmargin", "mimaxmargin", "milnce", "dcl", "crossclr", "ncl", "calince")
NORMALIZER_NAMES = ("none", "dn", "sinkhorn", "ncl", "qbnorm", "is", "dsl")
SAMPLINGS = ("captions", "videos", "k_captions")
LOG_TARGETS = ("csv", "tensorboard", "mlflow", "wandb")


#: Bounds of a config's YAML (issue 25.6): a 1 KB alias bomb ("billion laughs") expanded to ~3.5
#: billion elements and ran out of memory, a recursive alias or 10,000 nesting levels overflowed
#: the stack. A whole config is ~60 keys, 3 levels deep; these limits are far above any real one.
MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 10_000


class ConfigSyntaxError(ValueError):
    """YAML that parses but is refused: over a size bound, a recursive alias, a duplicate key."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``3e-4`` (no dot, YAML 1.2 style) as a float, so a
    quoted ``"0.05"`` is the only way to get a string and can be refused; that bounds the
    nesting depth while composing (before Python's stack can overflow) and refuses a key
    given twice in one mapping (PyYAML would keep the last one silently)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise ConfigSyntaxError(f"nested deeper than {MAX_YAML_DEPTH} levels "
                                        f"({_where(self.peek_event().start_mark)})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:  # the mapping's own keys; merged (<<) ones may be overridden
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    k = (key_node.tag, key_node.value)
                    if k in seen:
                        raise ConfigSyntaxError(f"key {key_node.value!r} given twice in one mapping "
                                                f"({_where(seen[k])} and {_where(key_node.start_mark)})")
                    seen[k] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _bounded_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:  # over Python's 4300-digit limit for int(str)
        raise ConfigSyntaxError(f"integer of {len(str(node.value))} digits ({_where(node.start_mark)})") from None


_Loader.add_constructor("tag:yaml.org,2002:int", _bounded_int)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph whose aliases expand beyond :data:`MAX_YAML_NODES` nodes or
    :data:`MAX_YAML_DEPTH` levels, or that refers to itself (a recursive alias).

    Each distinct node is visited once (iterative depth-first search, sizes memoised), so the
    check costs the size of the file, not of its expansion.
    """
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    open_: set[int] = set()  # the current path (started, not finished): a child there is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]

    def children(node: yaml.Node) -> list[yaml.Node]:
        if isinstance(node, yaml.SequenceNode):
            return list(node.value)
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return []

    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_.discard(key)
            kids = children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            height[key] = 1 + max((height[id(k)] for k in kids), default=0)
            if size[key] > MAX_YAML_NODES:
                raise ConfigSyntaxError(f"aliases expand to more than {MAX_YAML_NODES} values "
                                        f"({_where(node.start_mark)}); a config needs far fewer")
            if height[key] > MAX_YAML_DEPTH:
                raise ConfigSyntaxError(f"aliases nest deeper than {MAX_YAML_DEPTH} levels "
                                        f"({_where(node.start_mark)})")
            continue
        if key in size:
            continue
        open_.add(key)
        stack.append((node, True))
        for child in children(node):
            if id(child) in open_:
                raise ConfigSyntaxError(f"recursive alias: a value contains itself ({_where(child.start_mark)})")
            if id(child) not in size:
                stack.append((child, False))


def _yaml_load(text: str) -> Any:
    """YAML text -> Python values, bounded (:data:`MAX_YAML_DEPTH`, :data:`MAX_YAML_NODES`).

    Raises:
        yaml.YAMLError: not YAML (or a tag outside the safe set: no code runs).
        ConfigSyntaxError: over a bound, a recursive alias or a duplicate key (a ValueError).
    """
    loader = _Loader(text)  # a SafeLoader subclass: no Python tags
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    """One line: PyYAML's problem and where it is (its ``str`` spreads over several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        what = exc.problem or exc.context or type(exc).__name__
        mark = exc.problem_mark or exc.context_mark
        return f"{what} ({_where(mark)})" if mark is not None else what
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["Config", "load_config", "from_dict", "to_dict", "validate", "parse_overrides", "apply_overrides",
           "config_text", "save_config", "replace", "known_losses"]


def key(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None) -> Any:
    """A config field with its help text (the one source of ``xmodal config`` comments and
    ``docs/config.md``); ``factory`` for mutable defaults (``dict``)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class DataConfig:
    """Where the features come from.

    ``name``: ``synthetic`` (``xmodal.data.synthetic(**synthetic, seed=train.seed)``)
    or ``paired`` (the Flickr8k layout under ``root``; in a config file relative to the
    file's folder, on the command line to the working directory, see :func:`load_config`).
    ``noise``: fraction of training pairs whose text is shuffled to a wrong video
    (Cali-NCE Table 7). ``max_train_texts``: 0 = all.
    ``val_from_train``: when > 0, that many training videos (with all their texts) are
    held out of training as the validation split (epoch, normaliser and early-stopping
    selection); ``val_split`` is then not read, so ``test_split`` stays a pure test. The
    held-out rows are drawn with a fixed seed (the same for every ``train.seed``).
    """

    name: str = key("synthetic", "synthetic (built-in generator) | paired (feature files under data.root)")
    root: str = key("", "data directory of a paired layout (relative paths: to this file's folder)")
    train_split: str = key("train", "split prefix of the training files ({split}_video_features.npy ...)")
    val_split: str = key("val", "split used for early stopping and choosing the test-time normaliser")
    test_split: str = key("test", "split evaluated at the end when its files exist; '' = none")
    synthetic: dict = key(help="knobs of xmodal.data.synthetic, e.g. `{num_train: 2000, zipf_exponent: 1.0}`",
                          factory=dict)
    noise: float = key(0.0, "fraction of training pairs whose text is shuffled to a wrong video (Cali-NCE Table 7)")
    max_train_texts: int = key(0, "train on a seeded random subset of this many texts; 0 = all")
    val_from_train: int = key(0, "hold this many seeded training videos out as the validation split (val_split is then not read)")
    max_frames: int = key(12, "model.kind clip4clip: frames per video fed to the encoder (CLIP4Clip --max_frames)")
    max_words: int = key(32, "model.kind clip4clip: caption tokens incl. start and end (CLIP4Clip --max_words)")
    frame_pos: str = key("head", "model.kind clip4clip: which frames a longer video keeps: head | tail | uniform "
                                 "(CLIP4Clip --slice_framepos 0 | 1 | 2)")


@dataclass(frozen=True)
class ModelConfig:
    kind: str = key("linear", "video tower: linear | mlp | meanp (CLIP4Clip mean pooling) | transformer | identity "
                            "(zero-shot: no parameters, the features of an aligned encoder such as CLIP are the "
                            "embeddings; needs train.epochs: 0 and model.standardize: false) | clip4clip (the "
                            "encoder itself trained end to end from frames and captions: model.encoder, "
                            "docs/finetune.md)")
    text_kind: str = key("", "text tower kind; '' = same as kind (linear for frame-pooling kinds); with token "
                             "features [T, L, Dt] + S_text_mask.npy, transformer (COOT's word level) or meanp "
                             "pools the tokens (linear / mlp average them first)")
    dim: int = key(256, "joint embedding dimension")
    width: int = key(1024, "hidden width of mlp towers")
    depth: int = key(1, "hidden layers of mlp towers")
    dropout: float = key(0.0, "dropout in the towers, in [0, 1)")
    layers: int = key(2, "transformer layers of transformer towers")
    heads: int = key(8, "attention heads of transformer towers (must divide hidden)")
    hidden: int = key(512, "model width of transformer towers")
    standardize: bool = key(True, "standardise input features with training-set mean and std")
    fusion: str = key("gated", "several video experts: concat | gated (Collaborative Experts)")
    hierarchy: bool = key(False, "clips inside videos (CrossCLR app. A / COOT): global towers over a group's clip / "
                                 "sentence embeddings; needs S_video_to_group.npy; train.batch_size then counts whole "
                                 "groups (long videos) and train.sampling is not used; with model.block: release "
                                 "the global level is COOT's (docs/results/albums_related.md)")
    global_heads: int = key(8, "global transformer heads (Table 7: 8); its width is model.dim")
    global_layers: int = key(1, "global transformer layers (Table 7: 1)")
    block: str = key("xmodal", "transformer block of transformer towers and the global towers: xmodal (pre-norm, "
                               "feed-forward `4 x width`, learned positions, output Linear) | release (COOT / CrossCLR "
                               "release: post-norm, feed-forward = width, sine/cosine positions, input layer "
                               "norm, truncated-normal init, no output Linear: needs hidden = dim)")
    local_pooling: str = key("mean", "how transformer towers pool their frames (tokens): mean | max (per channel; "
                                     "CrossCLR Table 7 LSMDC 'Pooler Max', the release's local level) | atn "
                                     "(COOT's attention-aware feature aggregation, Table 7 YouCook2 'Pooler ATN')")
    pool_heads: int = key(2, "heads of atn pooling, each weighting its own slice of channels (Table 7 'AF heads 2')")
    pool_hidden: int = key(0, "scoring width of atn pooling over all heads; 0 = the pooled width (COOT YouCook2: "
                              "768 = 2 x 384)")
    global_pooling: str = key("mean", "global pooler: mean (COOT / the release's global level, LSMDC and "
                                      "YouCook2 alike) | max | atn (Table 7's Pooler row is the local level's: "
                                      "model.local_pooling)")
    global_context: bool = key(True, "COOT's context branch: the global towers cross-attend from the local "
                                     "embedding of the whole video (paragraph) to its clips (sentences) and "
                                     "concatenate the result (release block: embeddings of 2 x dim)")
    encoder: str = key("", "model.kind clip4clip: the CLIP to fine-tune, hf:DIR (a local transformers CLIPModel "
                           "or SiglipModel folder with its processor)")
    sim_header: str = key("meanP", "model.kind clip4clip: meanP (mean of the frame embeddings) | seqTransf "
                                   "(frame positions + a temporal transformer with a residual, from CLIP's text "
                                   "blocks; CLIP4Clip Sec. 3.3)")
    temporal_layers: int = key(4, "seqTransf: temporal transformer blocks, the first ones of CLIP's text transformer "
                                  "(CLIP4Clip --cross_num_hidden_layers)")
    freeze_layers: int = key(-1, "model.kind clip4clip: freeze CLIP's embeddings and its first N blocks in both "
                                 "encoders (CLIP4Clip --freeze_layer_num); -1 = nothing frozen")
    gradient_checkpointing: bool = key(False, "model.kind clip4clip: recompute CLIP's blocks in backward "
                                              "(transformers' gradient_checkpointing_enable): less memory, more time")


@dataclass(frozen=True)
class LossConfig:
    """``name`` is a key of ``xmodal.losses.LOSSES``; ``temperature`` / ``margin`` /
    ``learnable`` are passed when set; ``kwargs`` go to the constructor verbatim."""

    name: str = key("infonce", "objective: infonce | ntxent | maxmargin | mimaxmargin | milnce | dcl | crossclr "
                               "| ncl | calince")
    temperature: float | None = key(0.05, "softmax temperature of temperature losses (null: the loss's default)")
    margin: float | None = key(None, "margin of margin losses (null: the loss's default)")
    learnable: bool = key(False, "learn the temperature (log-parametrised) instead of fixing it")
    kwargs: dict = key(help="further constructor arguments of the loss, verbatim (e.g. {queue_size: 4096})",
                       factory=dict)
    global_weight: float = key(0.6, "model.hierarchy: L = L_local + global_weight * L_global (CrossCLR app. A)")
    global_name: str = key("", "the global level's loss ('' = loss.name)")
    global_kwargs: dict | None = key(None, "the global level's loss arguments (null = loss.kwargs without queue "
                                           "entries: app. A uses no queue at the global level)")


@dataclass(frozen=True)
class OptimConfig:
    name: str = key("adam", "optimiser: adam | adamw | radam")
    lr: float = key(1e-3, "peak learning rate (after warm-up; cosine decay to min_lr_ratio * lr)")
    weight_decay: float = key(0.0, "weight decay (decoupled for adamw)")
    betas: tuple = key((0.9, 0.999), "Adam betas [beta1, beta2]")
    eps: float = key(1e-8, "Adam epsilon (the CrossCLR / COOT release: `1.5e-9`)")
    grad_clip: float = key(1.0, "clip the gradient norm to this value; 0 disables clipping")
    warmup_epochs: float = key(1.0, "linear LR warm-up over this many epochs, then cosine decay")
    warmup_proportion: float = key(0.0, "> 0: the warm-up as this share of all steps instead of warmup_epochs "
                                        "(CLIP4Clip / NCL: `0.1`)")
    encoder_lr_scale: float = key(1e-3, "model.kind clip4clip: CLIP's own parameters train at lr x this (CLIP4Clip "
                                        "--coef_lr); the temporal head and the loss at lr")
    warmup_unit: str = key("step", "how the warm-up rises: step (the LR grows every step) | epoch (one LR per "
                                   "epoch, lr * (e + 1) / warmup_epochs in epoch e = 0, 1, ...: the CrossCLR / "
                                   "COOT release's ReduceLROnPlateauWarmup; needs whole warmup_epochs)")
    min_lr_ratio: float = key(0.0, "final LR as a fraction of lr, in [0, 1]")
    scheduler: str = key("cosine", "cosine (after warm-up) | plateau (ReduceLROnPlateau on the val metric after "
                                   "warm-up; CrossCLR sec. 4.3 / Table 7: patience 6, cooldown 4)")
    plateau_factor: float = key(0.1, "plateau: LR factor per reduction ('reduced by a factor of 10', sec. 4.3)")
    plateau_patience: int = key(6, "plateau: epochs without improvement before a reduction")
    plateau_cooldown: int = key(4, "plateau: epochs to wait after a reduction")
    ema: float = key(0.0, "exponential moving average of the weights, decay per step (e.g. `0.99`); validation, "
                          "the best epoch and model.pt then use the averaged weights; 0 disables")


@dataclass(frozen=True)
class ScheduleConfig:
    """TS++ temperature (or margin, for margin losses) schedules (thesis ch. 4).

    ``kind``: ``constant`` | ``cosine`` (eq. 4.1) | ``linear`` (eq. 4.2, over the whole
    run) around the loss's base value, moving within ``base +- alpha/2`` (``alpha`` is
    absolute, in temperature/margin units). The cosine period is ``period_epochs``, or,
    when ``cycles > 0``, ``(total_steps - 1) / cycles`` steps: ``cycles`` whole cycles from
    the first to the last optimisation step, so the run ends at the peak ``base +
    alpha/2`` (thesis sec. 4.1.1: "we select the period T for the cyclic cosine schedule such
    that three to five complete cycles occur during training, allowing the model to
    finish training with tau and m at their peak values"). A ``period_epochs`` that
    divides ``train.epochs`` puts the peak one step after the last one; nothing checks
    this (the thesis recommends it, it does not require it).
    ``class_temperature``: per-sample values from class frequencies (eqs. 4.3-4.6:
    ``v(c) + corr(step)``, linear in the class count; sec. 4.1.2: "frequent classes get
    higher temperatures"), between ``t_min`` and ``t_max`` for temperature losses and
    between ``m_min`` and ``m_max`` for margin losses (eq. 4.4), with classes from dataset
    ``labels`` or ``kmeans`` over the training caption features (``k`` clusters, sec.
    4.1.2; sec. 5.4: k = 200). The thesis states the base values (tau 0.07, m 0.2, sec. 5.4)
    and the temperature range [0.04, 0.1] of its cosine experiment (sec. 5.6.4) but no
    class bounds: the defaults here are xmodal's choices (margins centred on 0.2).
    ``directions``: ``both`` schedules both InfoNCE directions; ``t2v`` / ``v2t`` only that
    one, the other staying at the base ``loss.temperature`` (sec. 5.6.4, the asymmetric
    runs; losses with per-direction temperatures only: infonce, dcl).
    """

    kind: str = key("constant", "TS++ schedule of the temperature (margin): constant | cosine (eq. 4.1) "
                                "| linear (eq. 4.2)")
    alpha: float = key(0.04, "schedule amplitude: the value moves within base +- alpha/2 (absolute units)")
    period_epochs: float = key(10.0, "cosine period in epochs (unless cycles > 0)")
    cycles: int = key(0, "> 0: whole cosine cycles ending at the last step, at the peak (overrides period_epochs)")
    class_temperature: bool = key(False, "per-class values from class frequencies (TS++ eqs. 4.3-4.6)")
    classes: str = key("kmeans", "classes of class_temperature: labels (dataset) | kmeans (over caption features)")
    k: int = key(200, "k-means clusters for classes: kmeans (TS++ sec. 5.4)")
    t_min: float = key(0.03, "lowest per-class temperature")
    t_max: float = key(0.1, "highest per-class temperature")
    m_min: float = key(0.1, "lowest per-class margin (margin losses)")
    m_max: float = key(0.3, "highest per-class margin (margin losses)")
    directions: str = key("both", "directions the schedule applies to: both | t2v | v2t (the other keeps "
                                  "loss.temperature; TS++ sec. 5.6.4)")


@dataclass(frozen=True)
class TestTimeConfig:
    """Test-time normalisers fitted once at the end of training and tried on the
    validation split; one replaces ``none`` only when its gain by ``train.metric`` is clear of
    the per-query bootstrap spread (``selection: paired``, :mod:`xmodal.retrieval.selection`).
    ``sinkhorn`` uses a bank of ``bank_size`` training queries, ``ncl`` the NCL loss's own
    query queues (dropped for losses without one). ``oracle``: also report Sinkhorn
    biases fitted on the evaluated queries themselves (``sinkhorn_oracle``; never selected).

    ``dn_source``: where DN's means come from. ``train`` (default): ``dn_num_samples``
    random rows of the training query banks, so no validation data enters the stored
    test-time state. ``val``: the DN paper's protocol (sec. 4.3): ``dn_num_samples``
    (100) random unlabeled validation texts and videos, ``dn_seeds`` (5) sampling seeds.
    The paper averages the *metrics* of 5 per-seed fits; a run stores one normaliser, so
    ``val`` stores the average of the 5 per-seed means
    (``DistributionNormalization(num_samples=100, seeds=5)``). With ``val`` the DN state
    depends on the validation split that also selects the normaliser.
    """

    normalizers: tuple = key(("none", "dn", "sinkhorn", "ncl", "qbnorm"),
                             "candidate test-time normalisers tried on val: none | dn | sinkhorn | ncl | qbnorm "
                             "| is | dsl")
    bank_size: int = key(5000, "random training texts / videos in the query and gallery banks")
    dn_lam: float = key(0.25, "DN's lambda (the share of the mean subtracted)")
    dn_source: str = key("train", "where DN's means come from: train (query banks) | val (the DN paper's protocol)")
    dn_num_samples: int = key(100, "rows DN averages per seed")
    dn_seeds: int = key(1, "DN sampling seeds averaged (dn_source val: 5, the paper's)")
    qb_k: int = key(1, "QB-Norm's k (top-k of the query bank)")
    qb_beta: float = key(20.0, "QB-Norm's inverse temperature beta")
    sinkhorn_iters: int = key(4, "Sinkhorn iterations of the sinkhorn / ncl biases")
    oracle: bool = key(True, "also report Sinkhorn fitted on the evaluated queries (an oracle, never selected)")
    selection: str = key("paired", "how the run's normaliser is chosen on val: paired (a candidate replaces none only "
                                   "when the lower end of its paired bootstrap 95% interval over the val queries is "
                                   "above none's score) | best (the highest val score, however small the gain)")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = key(0, "seed of the model init, batches, synthetic data and test-time banks")
    epochs: int = key(20, "maximum number of epochs")
    batch_size: int = key(256, "pairs per optimisation step (the global batch under torchrun)")
    sampling: str = key("captions", "captions: every caption once per epoch | videos: one caption per video | "
                                    "k_captions: each video with captions_per_video captions (MIL-NCE)")
    captions_per_video: int = key(4, "K of k_captions; must divide batch_size")
    metric: str = key("rsum", "early-stopping / selection metric on val: rsum | r1 (mean of t2v/v2t R@1) | "
                              "map (mAP T->V, EPIC-100 MIR; needs relevancy) | p2v_rsum (R@1,5,10 of p2v + v2p; "
                              "a val split with groups)")
    patience: int = key(5, "epochs without improvement before stopping; 0 = never")
    keep: str = key("best", "weights kept in model.pt: best (the epoch with the best val metric) | last (the final "
                            "epoch: a fixed schedule, e.g. a refit on all training data; needs patience 0)")
    device: str = key("auto", "auto | cpu | cuda")
    amp: bool = key(True, "bfloat16 mixed precision, only ever used on GPU (with precision: fp32)")
    precision: str = key("fp32", "forward precision: fp32 (train.amp decides on GPU) | bf16 | fp16 (autocast on the "
                                 "training device; fp16 with a gradient scaler)")
    chunk_size: int = key(0, "> 0: gradient caching (Gao et al. 2021): the batch is embedded without a graph, "
                             "the loss's gradient taken at the embeddings, then chunks of this many rows re-run "
                             "with a graph; the same gradients in the memory of one chunk. 0 = off")
    progress: bool = key(True, "progress bars on a terminal (never in a log file)")
    eval_batch_size: int = key(8192, "rows per batch when embedding a split for evaluation")
    workers: int = key(0, "DataLoader worker processes gathering the next batches from the (memory-mapped) "
                          "features while the model steps; 0 = in the training process (best for small heads "
                          "on few cores)")
    checkpoint_minutes: float = key(30.0, "also write checkpoint.pt inside an epoch once this many minutes have passed "
                                          "since the last one (a killed run resumes from that batch, bit-identically); "
                                          "0 = only at epoch ends")
    log_to: tuple = key((), "extra logs beside log.jsonl: csv (RUN/log.csv) | tensorboard (RUN/tensorboard/) | "
                            "mlflow (RUN/mlflow.db unless MLFLOW_TRACKING_URI; extra [mlflow]) | wandb (offline, "
                            "RUN/wandb/, unless WANDB_MODE; extra [wandb])")


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    test_time: TestTimeConfig = field(default_factory=TestTimeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


_OPTIONAL_NUMBERS = ("loss.temperature", "loss.margin")
_SECTION_TYPES = {"data": DataConfig, "model": ModelConfig, "loss": LossConfig, "optim": OptimConfig,
                  "schedule": ScheduleConfig, "test_time": TestTimeConfig, "train": TrainConfig}


def _short(v: Any, limit: int = 60) -> str:
    """One line for an error message: arrays by shape, anything else by a truncated repr."""
    shape = getattr(v, "shape", None)
    if shape is not None and len(shape) > 0:
        return f"an array of shape {tuple(shape)}"
    text = " ".join(repr(v).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_config(cfg: Any, name: str = "cfg") -> None:
    if not isinstance(cfg, Config):
        raise TypeError(f"{name}: expected an xmodal.config.Config (load_config / from_dict), got {_short(cfg)}")


def to_dict(cfg: Config) -> dict:
    """Plain nested dict (tuples become lists), the form saved as YAML."""
    _check_config(cfg)
    def plain(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return {name: {f.name: plain(getattr(getattr(cfg, name), f.name)) for f in fields(_SECTION_TYPES[name])}
            for name in _SECTION_TYPES}


#: Keys of earlier versions and their names now.
_RENAMED = {("model", "pooling"): "model.global_pooling (model.local_pooling pools a transformer tower's frames)"}


def from_dict(d: dict | None) -> Config:
    """Build and validate a :class:`Config`; unknown sections/keys raise ``ValueError``."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ValueError(f"config: expected a mapping at the top level, got {type(d).__name__}")
    sections = {}
    for name, value in d.items():
        if name not in _SECTION_TYPES:
            raise ValueError(f"config: unknown section {_short(name)}; expected one of {', '.join(_SECTION_TYPES)}")
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ValueError(f"{name}: expected a mapping, got {_short(value)}")
        cls = _SECTION_TYPES[name]
        known = {f.name: f for f in fields(cls)}
        kw = {}
        for key, v in value.items():
            if key not in known and (name, key) in _RENAMED:
                raise ValueError(f"{name}.{key}: renamed; use {_RENAMED[name, key]}")
            if key not in known:
                raise ValueError(f"{name}.{key}: unknown key; expected one of {', '.join(known)}")
            kw[key] = _coerce(v, known[key], f"{name}.{key}")
        sections[name] = cls(**kw)
    cfg = Config(**sections)
    validate(cfg)
    return cfg


def _coerce(v: Any, f: dataclasses.Field, where: str) -> Any:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    if isinstance(default, tuple):
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {_short(v)}")
        return tuple(v)
    if isinstance(default, dict):
        if not isinstance(v, dict):
            raise ValueError(f"{where}: expected a mapping, got {_short(v)}")
        return dict(v)
    if isinstance(default, bool):
        if not isinstance(v, bool):
            raise ValueError(f"{where}: expected true/false, got {_short(v)}")
        return v
    if isinstance(default, int):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{where}: expected an integer, got {_short(v)}")
        return v
    if isinstance(default, float) or (default is None and where.split(".")[-1] in ("temperature", "margin")):
        if v is None and where in _OPTIONAL_NUMBERS:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{where}: expected a number, got {_short(v)}")
        return float(v)
    if isinstance(default, str):
        if not isinstance(v, str):
            raise ValueError(f"{where}: expected a string, got {_short(v)}")
        return v
    return v


def _positive(v: float, where: str) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        raise ValueError(f"{where}: must be a positive number, got {_short(v)}")


def _nonneg(v: float, where: str) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
        raise ValueError(f"{where}: must be a non-negative number, got {_short(v)}")


def _one_of(v: str, where: str, options: Iterable[str]) -> None:
    options = tuple(options)
    if v not in options:
        raise ValueError(f"{where}: unknown value {_short(v)}; expected one of {', '.join(options)}")


def _scheduled(loss: str) -> str | None:
    """The quantity the loss declares as scheduled (``temperature``/``margin``/None)."""
    try:
        from xmodal.losses import loss_spec
    except ImportError:
        return "margin" if "margin" in loss else "temperature"
    return loss_spec(loss).keyword


def known_losses() -> tuple[str, ...]:
    try:
        from xmodal.losses import LOSSES
    except ImportError:  # losses package not importable: fall back to the API names
        return KNOWN_LOSSES
    return tuple(LOSSES)


#: Upper bounds of the model sizes (a typo such as ``model.width=100000000000`` is refused
#: before any module is built instead of allocating terabytes).
MAX_MODEL_SIZE = {"dim": 1 << 16, "width": 1 << 17, "hidden": 1 << 17, "depth": 64, "layers": 64, "heads": 256,
                  "pool_heads": 256, "pool_hidden": 1 << 17}
#: Largest ``optim.lr`` accepted.
MAX_LR = 10.0


def _test_time_values(t: TestTimeConfig) -> None:
    """The test-time hyper-parameters through the normalisers' own checks, before epoch 1
    (they are only used after the last epoch)."""
    from xmodal.normalize import DistributionNormalization, QBNorm, SinkhornBias

    checks = [("sinkhorn_iters", lambda: SinkhornBias(iters=t.sinkhorn_iters)),
              ("qb_k", lambda: QBNorm(k=t.qb_k)),
              ("dn_lam", lambda: DistributionNormalization(lam=t.dn_lam))]
    for name, make in checks:
        try:
            make()
        except (ValueError, TypeError) as exc:
            msg = str(exc).split(":", 1)[-1].strip()
            raise ValueError(f"test_time.{name}: {msg}") from None


def _synthetic_keys(knobs: dict) -> None:
    """``data.synthetic`` holds keyword arguments of :func:`xmodal.data.synthetic` (not ``seed``:
    ``train.seed`` is passed); an unknown key is refused here, not after the run started."""
    import inspect

    from xmodal.data.synthetic import synthetic

    allowed = [p for p in inspect.signature(synthetic).parameters if p != "seed"]
    for name in knobs:
        if name == "seed":
            raise ValueError("data.synthetic.seed: the synthetic data's seed is train.seed")
        if name not in allowed:
            raise ValueError(f"data.synthetic.{name}: unknown key; expected one of {', '.join(allowed)}")



def zero_shot_without_train(cfg: "Config") -> bool:
    """A zero-shot run (``model.kind: identity``) on a layout whose train split is wholly absent (none of
    its files): it runs on val / test alone, and the normalisers fitted on train queries are skipped.
    A partly written train split, ``data.val_from_train`` (carved out of train) or synthetic data: False."""
    d = cfg.data
    if cfg.model.kind != "identity" or d.name != "paired" or not d.root or d.val_from_train:
        return False
    from xmodal.data.layout import REQUIRED, missing_files

    try:
        return len(missing_files(d.root, d.train_split)) == len(REQUIRED)
    except (OSError, ValueError):
        return False


def _check_identity(cfg: "Config") -> None:
    """``model.kind: identity`` (a zero-shot run: nothing to train) and its constraints."""
    m, tr = cfg.model, cfg.train
    if "identity" not in (m.kind, m.text_kind):
        return
    if m.kind != "identity" or m.text_kind not in ("", "identity"):
        raise ValueError(f"model.text_kind: an identity model has identity towers on both sides, got kind "
                         f"{m.kind} and text_kind {m.text_kind or m.kind}")
    if tr.epochs != 0:
        raise ValueError(f"train.epochs: model.kind identity has no parameters to train; set train.epochs: 0 "
                         f"(got {tr.epochs})")
    if m.standardize:
        raise ValueError("model.standardize: an identity model takes the features as they are; set "
                         "model.standardize: false")
    if m.hierarchy:
        raise ValueError("model.hierarchy: not with model.kind identity")

def _check_clip4clip(cfg: "Config") -> None:
    """``model.kind: clip4clip`` (an encoder trained end to end) and the keys that go with it."""
    m, d, o, tr = cfg.model, cfg.data, cfg.optim, cfg.train
    if m.sim_header == "tightTransf":
        from xmodal.models.clip4clip import TIGHT_REFUSED

        raise ValueError(TIGHT_REFUSED)
    _one_of(m.sim_header, "model.sim_header", ("meanP", "seqTransf"))
    _one_of(d.frame_pos, "data.frame_pos", ("head", "tail", "uniform"))
    _one_of(tr.precision, "train.precision", ("fp32", "bf16", "fp16"))
    for name, value, low in (("data.max_frames", d.max_frames, 1), ("data.max_words", d.max_words, 2),
                             ("model.temporal_layers", m.temporal_layers, 0), ("model.freeze_layers", m.freeze_layers, -1),
                             ("train.chunk_size", tr.chunk_size, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low or value > 1 << 20:
            raise ValueError(f"{name}: expected an integer in [{low}, {1 << 20}], got {_short(value)}")
    if not 0 < o.encoder_lr_scale <= 1e3:
        raise ValueError(f"optim.encoder_lr_scale: must lie in (0, 1000], got {o.encoder_lr_scale}")
    if not 0 <= o.warmup_proportion < 1:
        raise ValueError(f"optim.warmup_proportion: must lie in [0, 1), got {o.warmup_proportion}")
    if tr.chunk_size and m.hierarchy:
        raise ValueError("train.chunk_size: gradient caching chunks flat batches; not with model.hierarchy")
    if m.kind != "clip4clip":
        if m.encoder:
            raise ValueError(f"model.encoder: only read by model.kind clip4clip, got model.kind {m.kind}")
        return
    if not m.encoder.startswith("hf:"):
        raise ValueError(f"model.encoder: model.kind clip4clip needs hf:DIR (a local CLIPModel or SiglipModel folder), got "
                         f"{_short(m.encoder or '(empty)')}")
    if m.text_kind not in ("", "clip4clip"):
        raise ValueError(f"model.text_kind: a clip4clip model trains CLIP's own text tower, got {m.text_kind}")
    if m.hierarchy:
        raise ValueError("model.hierarchy: not with model.kind clip4clip")


def validate(cfg: Config) -> None:
    """Raise a one-line ``ValueError`` naming the first bad field."""
    _check_config(cfg)
    d = cfg.data
    _one_of(d.name, "data.name", ("synthetic", "paired"))
    if not 0 <= d.noise < 1:
        raise ValueError(f"data.noise: must lie in [0, 1), got {d.noise!r}")
    if d.max_train_texts < 0:
        raise ValueError(f"data.max_train_texts: must be >= 0, got {d.max_train_texts}")
    if d.name == "synthetic":
        _synthetic_keys(d.synthetic)
    if d.name == "paired":
        if not d.root:
            raise ValueError("data.root: required when data.name is 'paired'")
        root = Path(d.root)
        try:
            found = root.is_dir()
        except (OSError, ValueError) as exc:  # a name too long for the file system, a NUL byte
            raise ValueError(f"data.root: {getattr(exc, 'strerror', None) or exc} ({d.root[:80]!r}...)") from None
        if not found:
            where = "" if root.is_absolute() else f" (relative to {Path.cwd()})"
            raise ValueError(f"data.root: directory {_short(d.root, 200)} not found{where}")
        from xmodal.data.layout import missing_files  # h-data: the one list of layout names

        if d.val_from_train < 0:
            raise ValueError(f"data.val_from_train: must be >= 0, got {d.val_from_train}")
        for split_field in ("train_split",) + (("val_split",) if not d.val_from_train else ()):
            missing = missing_files(root, getattr(d, split_field))
            if split_field == "train_split" and zero_shot_without_train(cfg):
                continue  # a zero-shot run needs no train split (the bank normalisers are skipped)
            if missing:
                raise ValueError(f"data.{split_field}: missing file(s) in {root}: {'; '.join(missing)}")
    m = cfg.model
    _one_of(m.kind, "model.kind", ("linear", "mlp", "meanp", "transformer", "identity", "clip4clip"))
    _one_of(m.fusion, "model.fusion", ("concat", "gated"))
    if m.text_kind and m.kind != "clip4clip":
        _one_of(m.text_kind, "model.text_kind", ("linear", "mlp", "meanp", "transformer", "identity"))
    _check_identity(cfg)
    for name in ("dim", "width", "depth", "layers", "heads", "hidden"):
        if getattr(m, name) <= 0:
            raise ValueError(f"model.{name}: must be positive, got {getattr(m, name)}")
        limit = MAX_MODEL_SIZE[name]
        if getattr(m, name) > limit:  # refused before any module is allocated
            raise ValueError(f"model.{name}: at most {limit}, got {getattr(m, name)}")
    if not 0 <= m.dropout < 1:
        raise ValueError(f"model.dropout: must lie in [0, 1), got {m.dropout}")
    if m.kind == "transformer" and m.hidden % m.heads:
        raise ValueError(f"model.heads: must divide model.hidden ({m.hidden}), got {m.heads}")
    _one_of(m.block, "model.block", ("xmodal", "release"))
    _one_of(m.local_pooling, "model.local_pooling", ("mean", "max", "atn"))
    _one_of(m.global_pooling, "model.global_pooling", ("mean", "max", "atn"))
    if m.pool_heads <= 0:
        raise ValueError(f"model.pool_heads: must be positive, got {m.pool_heads}")
    if m.pool_hidden < 0:
        raise ValueError(f"model.pool_hidden: must be 0 (the pooled width) or positive, got {m.pool_hidden}")
    for name in ("pool_heads", "pool_hidden"):
        if getattr(m, name) > MAX_MODEL_SIZE[name]:  # refused before any module is allocated
            raise ValueError(f"model.{name}: at most {MAX_MODEL_SIZE[name]}, got {getattr(m, name)}")
    transformer_towers = "transformer" in (m.kind, m.text_kind)
    if m.local_pooling != "mean" and not transformer_towers:
        raise ValueError(f"model.local_pooling: {m.local_pooling} pools a transformer tower's frames; set "
                         f"model.kind or model.text_kind to transformer (or local_pooling: mean)")
    if m.local_pooling == "atn" and transformer_towers and (m.hidden % m.pool_heads
                                                           or (m.pool_hidden or m.hidden) % m.pool_heads):
        raise ValueError(f"model.pool_heads: must divide model.hidden ({m.hidden}) and model.pool_hidden, got "
                         f"{m.pool_heads}")
    if m.block == "release" and transformer_towers and m.hidden != m.dim:
        raise ValueError(f"model.hidden: the release block has no output layer, so model.hidden must equal "
                         f"model.dim ({m.dim}), got {m.hidden}")
    if m.hierarchy and m.global_pooling == "atn" and (m.dim % m.pool_heads or (m.pool_hidden or m.dim) % m.pool_heads):
        raise ValueError(f"model.pool_heads: must divide model.dim ({m.dim}) and model.pool_hidden for atn "
                         f"global pooling, got {m.pool_heads}")
    for name in ("global_heads", "global_layers"):
        if getattr(m, name) <= 0:
            raise ValueError(f"model.{name}: must be positive, got {getattr(m, name)}")
    if m.hierarchy and m.dim % m.global_heads:
        raise ValueError(f"model.global_heads: must divide model.dim ({m.dim}), got {m.global_heads}")
    _check_clip4clip(cfg)
    lo = cfg.loss
    _one_of(lo.name, "loss.name", known_losses())
    if lo.temperature is not None:
        _positive(lo.temperature, "loss.temperature")
    if lo.margin is not None:
        _nonneg(lo.margin, "loss.margin")
    _nonneg(lo.global_weight, "loss.global_weight")
    if lo.global_name:
        _one_of(lo.global_name, "loss.global_name", known_losses())
    if lo.global_kwargs is not None and not isinstance(lo.global_kwargs, dict):
        raise ValueError(f"loss.global_kwargs: expected a mapping, got {_short(lo.global_kwargs)}")
    for key, value in lo.kwargs.items():
        if any(word in str(key) for word in ("temperature", "margin")) and value is not None and (
                isinstance(value, (bool, str)) or not isinstance(value, (int, float))):
            raise ValueError(f"loss.kwargs.{key}: expected a number, got {_short(value)}")
    o = cfg.optim
    _one_of(o.name, "optim.name", ("adam", "adamw", "radam"))
    _positive(o.lr, "optim.lr")
    if o.lr > MAX_LR:  # Adam with such a step overflows the weights at once
        raise ValueError(f"optim.lr: at most {MAX_LR:g} (larger steps diverge at once), got {o.lr:g}")
    _nonneg(o.weight_decay, "optim.weight_decay")
    _nonneg(o.grad_clip, "optim.grad_clip")
    _positive(o.eps, "optim.eps")
    _nonneg(o.warmup_epochs, "optim.warmup_epochs")
    _one_of(o.warmup_unit, "optim.warmup_unit", ("step", "epoch"))
    if o.warmup_unit == "epoch" and o.warmup_epochs != int(o.warmup_epochs):
        raise ValueError(f"optim.warmup_epochs: must be a whole number with optim.warmup_unit: epoch (one LR per "
                         f"epoch), got {o.warmup_epochs}")
    if len(o.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in o.betas):
        raise ValueError(f"optim.betas: expected two numbers in [0, 1), got {list(o.betas)}")
    if not 0 <= o.min_lr_ratio <= 1:
        raise ValueError(f"optim.min_lr_ratio: must lie in [0, 1], got {o.min_lr_ratio}")
    _one_of(o.scheduler, "optim.scheduler", ("cosine", "plateau"))
    if not (isinstance(o.ema, (int, float)) and 0 <= o.ema < 1):
        raise ValueError(f"optim.ema: must lie in [0, 1) (0 disables the weight average), got {o.ema!r}")
    if not 0 < o.plateau_factor < 1:
        raise ValueError(f"optim.plateau_factor: must lie in (0, 1), got {o.plateau_factor}")
    for name in ("plateau_patience", "plateau_cooldown"):
        if getattr(o, name) < 0:
            raise ValueError(f"optim.{name}: must be >= 0, got {getattr(o, name)}")
    s = cfg.schedule
    _one_of(s.kind, "schedule.kind", ("constant", "cosine", "linear"))
    _nonneg(s.alpha, "schedule.alpha")
    _positive(s.period_epochs, "schedule.period_epochs")
    _one_of(s.classes, "schedule.classes", ("labels", "kmeans"))
    _one_of(s.directions, "schedule.directions", ("both", "t2v", "v2t"))
    if s.k < 1:
        raise ValueError(f"schedule.k: must be >= 1, got {s.k}")
    if _scheduled(lo.name) != "margin" and lo.temperature is not None and s.kind != "constant" \
            and s.alpha / 2 >= lo.temperature:
        raise ValueError(f"schedule.alpha: {s.alpha} would drive the temperature {lo.temperature} to <= 0 "
                         f"(it moves within temperature +- alpha/2)")
    _positive(s.t_min, "schedule.t_min")
    _positive(s.t_max, "schedule.t_max")
    if s.t_min > s.t_max:
        raise ValueError(f"schedule.t_min: must not exceed schedule.t_max ({s.t_min} > {s.t_max})")
    _nonneg(s.m_min, "schedule.m_min")
    _nonneg(s.m_max, "schedule.m_max")
    if s.m_min > s.m_max:
        raise ValueError(f"schedule.m_min: must not exceed schedule.m_max ({s.m_min} > {s.m_max})")
    if s.cycles < 0:
        raise ValueError(f"schedule.cycles: must be >= 0, got {s.cycles}")
    t = cfg.test_time
    if not t.normalizers:
        raise ValueError("test_time.normalizers: must name at least one normaliser (e.g. none)")
    for n in t.normalizers:
        _one_of(n, "test_time.normalizers", NORMALIZER_NAMES)
    if t.bank_size < 1:
        raise ValueError(f"test_time.bank_size: must be >= 1, got {t.bank_size}")
    _nonneg(t.dn_lam, "test_time.dn_lam")
    _one_of(t.dn_source, "test_time.dn_source", ("train", "val"))
    _one_of(t.selection, "test_time.selection", ("paired", "best"))
    for name in ("dn_num_samples", "dn_seeds"):
        if getattr(t, name) < 1:
            raise ValueError(f"test_time.{name}: must be >= 1, got {getattr(t, name)}")
    _positive(t.qb_beta, "test_time.qb_beta")
    _test_time_values(t)
    tr = cfg.train
    if not 0 <= tr.seed < 2 ** 32:  # numpy's and torch's generators take any seed in this range
        raise ValueError(f"train.seed: must lie in [0, 2**32), got {tr.seed}")
    if tr.epochs < 0 or (tr.epochs == 0 and cfg.model.kind != "identity"):
        raise ValueError(f"train.epochs: must be >= 1, got {tr.epochs} (0: only for model.kind: identity, "
                         f"the zero-shot run)")
    for name in ("batch_size", "eval_batch_size"):
        if getattr(tr, name) < 1:
            raise ValueError(f"train.{name}: must be >= 1, got {getattr(tr, name)}")
    if tr.batch_size < 2:
        raise ValueError("train.batch_size: contrastive losses need at least 2 pairs per batch")
    if tr.workers < 0:
        raise ValueError(f"train.workers: must be >= 0, got {tr.workers}")
    _nonneg(tr.checkpoint_minutes, "train.checkpoint_minutes")
    _one_of(tr.sampling, "train.sampling", SAMPLINGS)
    if tr.captions_per_video < 1:
        raise ValueError(f"train.captions_per_video: must be >= 1, got {tr.captions_per_video}")
    if tr.sampling == "k_captions" and tr.batch_size % tr.captions_per_video:
        raise ValueError(f"train.captions_per_video: {tr.captions_per_video} must divide train.batch_size "
                         f"({tr.batch_size})")
    _one_of(tr.metric, "train.metric", ("rsum", "r1", "map", "p2v_rsum"))
    _one_of(tr.device, "train.device", ("auto", "cpu", "cuda"))
    if tr.patience < 0:
        raise ValueError(f"train.patience: must be >= 0, got {tr.patience}")
    _one_of(tr.keep, "train.keep", ("best", "last"))
    if tr.keep == "last" and tr.patience:
        raise ValueError(f"train.keep: 'last' trains the whole schedule; set train.patience: 0 (got {tr.patience})")
    for target in tr.log_to:
        _one_of(target, "train.log_to", LOG_TARGETS)


def parse_overrides(overrides: Iterable[str]) -> list[tuple[list[str], Any]]:
    """``["loss.name=ncl", ...]`` -> ``[(["loss", "name"], "ncl"), ...]`` (values parsed as YAML)."""
    if isinstance(overrides, (str, bytes)) or hasattr(overrides, "shape") or not hasattr(overrides, "__iter__"):
        raise TypeError(f"overrides: expected a list of 'section.key=value' strings, got {_short(overrides)}")
    out = []
    for item in overrides:
        if not isinstance(item, str):
            raise TypeError(f"overrides: expected 'section.key=value' strings, got {_short(item)}")
        if "=" not in item:
            raise ValueError(f"override {_short(item)}: expected section.key=value")
        key, raw = item.split("=", 1)
        path = [p for p in key.strip().lstrip("-").split(".") if p]
        if len(path) < 2:
            raise ValueError(f"override {_short(item)}: expected section.key=value")
        try:
            value = _yaml_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        except ValueError as exc:  # ConfigSyntaxError: parsed, but over a bound or a duplicate key
            raise ValueError(f"override {_short(item)}: {exc}") from None
        out.append((path, value))
    return out


def apply_overrides(d: dict, overrides: Iterable[str]) -> dict:
    """A copy of the nested dict ``d`` with ``section.key=value`` overrides applied."""
    if not isinstance(d, dict):
        raise TypeError(f"d: expected a nested dict of config sections, got {_short(d)}")
    try:
        d = _yaml_load(yaml.safe_dump(d)) or {}
    except yaml.YAMLError as exc:  # a value YAML cannot hold (an array, an object)
        raise TypeError(f"d: holds a value that is not plain YAML data ({_yaml_error_text(exc)})") from None
    for path, value in parse_overrides(overrides):
        node = d
        for p in path[:-1]:
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
            if not isinstance(node, dict):
                raise ValueError(f"{'.'.join(path)}: {p!r} is not a section")
        node[path[-1]] = value
    return d


#: config fields holding file system paths (resolved by :func:`load_config`).
PATH_FIELDS = (("data", "root"),)


def _get(d: dict, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)  # type: ignore[assignment]
    return d


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # a name too long for the file system: validate() names the key
        return False


def _resolve_paths(d: dict, base: Path | None, overridden: set[tuple[str, ...]]) -> dict:
    """Make the :data:`PATH_FIELDS` of ``d`` absolute (a new dict; ``d`` is not modified).

    A relative path written in the config file is relative to the file's folder
    (``base``); one given as a command-line override, or with no file, is relative to
    the working directory. Absolute paths are kept. Compatibility with configs written
    before this rule (e.g. a run directory's ``config.yaml`` holding ``../shared/...``
    meant from the repository root): when the file-relative path is not a directory but
    the working-directory one is, the latter is used with a ``FutureWarning``.
    """
    import copy
    import os
    import warnings

    d = copy.deepcopy(d)
    for keys in PATH_FIELDS:
        value = _get(d, keys)
        if not isinstance(value, str) or not value or Path(value).is_absolute():
            continue
        from_file = base is not None and keys not in overridden
        path = Path(os.path.abspath(Path(base) / value)) if from_file else Path(os.path.abspath(value))
        if from_file and not _is_dir(path) and _is_dir(Path(value)):
            warnings.warn(f"{'.'.join(keys)}: {value!r} is not a directory relative to the config file's "
                          f"folder {base}; using it relative to the working directory. Paths in a config "
                          f"file are relative to the file: update the config.", FutureWarning, stacklevel=3)
            path = Path(os.path.abspath(value))
        _get(d, keys[:-1])[keys[-1]] = str(path)
    return d


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Read a YAML config (``None``: the defaults), apply overrides, validate.

    Relative paths (``data.root``) become absolute: those written in the file are
    relative to the file's folder, those given as overrides (``--set data.root=...``)
    or without a file are relative to the working directory. The resolved config (as
    saved in a run directory) therefore loads the same from anywhere.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> (folder / "data").mkdir()
    >>> _ = (folder / "c.yaml").write_text("data: {root: data}")
    >>> load_config(folder / "c.yaml").data.root == str(folder.resolve() / "data")
    True
    """
    d: dict = {}
    if path is not None:
        d = _read_config(Path(path))
        if not isinstance(d, dict):
            raise ValueError(f"config: {path} must hold a mapping of sections at the top level, "
                             f"got a {type(d).__name__}")
    overrides = list(overrides)
    overridden = {tuple(keys) for keys, _ in parse_overrides(overrides)}
    base = Path(path).resolve().parent if path is not None else None
    return from_dict(_resolve_paths(apply_overrides(d, overrides), base, overridden))


def _read_config(p: Path) -> Any:
    """The YAML of a config file; an empty file, a folder or non-UTF-8 bytes is one line naming it
    (an empty file is never the defaults in disguise: give no CONFIG for those)."""
    if p.is_dir():
        raise ValueError(f"config: {p} is a directory, not a YAML file")
    if not p.is_file():
        raise FileNotFoundError(f"config: {p} not found")
    size = p.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ValueError(f"config: {p} is {size} bytes; a config is a few KB (at most {MAX_YAML_BYTES} bytes)")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"config: {p} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if not text.strip():
        raise ValueError(f"config: {p} is empty (give no CONFIG for the defaults)")
    try:
        d = _yaml_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"config: {p} is not valid YAML ({_yaml_error_text(exc)})") from None
    except ConfigSyntaxError as exc:
        raise ValueError(f"config: {p}: {exc}") from None
    return {} if d is None else d  # only comments: the defaults, as written


def config_text(cfg: Config) -> str:
    """The YAML :func:`save_config` writes."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as YAML through a temporary file renamed over ``path`` (never through a link)."""
    import os

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        tmp.write_text(config_text(cfg))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace(cfg: Config, **sections: dict) -> Config:
    """``replace(cfg, loss={"name": "ncl"})``: a validated copy with some fields changed."""
    d = to_dict(cfg)
    for name, values in sections.items():
        if name not in d:
            raise ValueError(f"config: unknown section {name!r}")
        if not isinstance(values, dict):
            raise TypeError(f"{name}: expected a dict of keys to change, got {_short(values)}")
        d[name].update(values)
    return from_dict(d)
