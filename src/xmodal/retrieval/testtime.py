"""A trained run's test-time pipeline: the normalisers fitted once, and which one was selected.

:class:`TestTime` is what ``model.test_time`` holds and what ``model.pt`` stores
(plain tensors, numbers and strings: weights-only loadable). It is fitted once, at the
end of training (:func:`fit_test_time`), on query banks embedded by the final model:

| name | stored state, and what runs on a gallery |
|---|---|
| ``none`` | nothing: cosine scores |
| ``dn`` | the fitted means ``mu_text``, ``mu_video`` (DN eq. 7), from the train banks or (``dn_source: val``) validation samples; nothing is recomputed for a new gallery |
| ``sinkhorn`` | a bank of train queries (random texts / videos) + temperature + iterations; the gallery biases (NCL eq. 13) are computed against the gallery being searched |
| ``ncl`` | as ``sinkhorn`` with the NCL loss's own queue of train queries (the NCL paper's test-time method) |
| ``qbnorm`` / ``is`` | a bank of train queries + ``k``/``beta`` (QB-Norm) |
| ``dsl`` | temperature; dual softmax over the test queries themselves |
| ``sinkhorn_oracle`` | temperature + iterations; Sinkhorn biases fitted on the test queries themselves (NCL's oracle; alias ``ncl_oracle``) |

A gallery bias is a function of the gallery, so for Sinkhorn / QB-Norm / IS "no
refitting" means: the stored banks and hyper-parameters are fixed at training time and
the bias computation against a gallery is deterministic (same gallery, same scores);
only DN is a gallery-independent stored transform. ``dsl`` and ``sinkhorn_oracle`` use
the test queries (``uses_test_queries``): reported, never selected automatically.

Directions: retrieval ``t2v`` normalises the ``[T, V]`` scores with the text bank
against the video gallery; ``v2t`` normalises ``[V, T]`` with the video bank against
the text gallery. For ``none`` and ``dn`` the ``v2t`` scores are the transpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from xmodal._validate import short_repr
from xmodal.normalize import Normalizer
from xmodal.normalize import build_normalizer as _registry_build

__all__ = ["TestTime", "NAMES", "ORACLE_NAMES", "bank_of", "build_normalizer", "fit_normalizer", "fit_test_time",
           "uses_test_queries"]

#: every test-time name -> (normaliser registry key, bank it is fitted on)
_METHODS: dict[str, tuple[str, str | None]] = {
    "none": ("none", None), "dn": ("dn", "train"), "sinkhorn": ("sinkhorn", "train"),
    "ncl": ("sinkhorn", "ncl"), "qbnorm": ("qbnorm", "train"), "is": ("is", "train"),
    "dsl": ("dsl", "queries"), "sinkhorn_oracle": ("sinkhorn", "queries"),
}
_ALIASES = {"ncl_oracle": "sinkhorn_oracle"}
NAMES = tuple(_METHODS)
ORACLE_NAMES = ("sinkhorn_oracle",)
_SYMMETRIC = ("none", "dn")
#: ``hparams`` keys that record how the run was fitted, not normaliser settings.
RECORDS = ("dn_source", "heldout")


def _canonical(name: str, arg: str = "normalizer") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{arg}: expected a string, got {type(name).__name__}")
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _METHODS:
        raise ValueError(f"{arg}: unknown normaliser {name!r}; expected one of {', '.join(NAMES)}")
    return key


def bank_of(name: str) -> str | None:
    """The bank a test-time normaliser is fitted on: ``train`` (train queries), ``ncl`` (the NCL loss's
    queue of train queries), ``queries`` (the test queries: an oracle) or None (``none``).

    >>> bank_of("qbnorm"), bank_of("ncl"), bank_of("dsl")
    ('train', 'ncl', 'queries')
    """
    return _METHODS[_canonical(name)][1]


def uses_test_queries(name: str) -> bool:
    """True for normalisers whose statistics come from the test queries (oracles)."""
    return _METHODS[_canonical(name)][1] == "queries"


def build_normalizer(name: str, *, temperature: float = 0.05, iters: int = 4, lam: float = 0.25,
                     k: int = 1, beta: float = 20.0, num_samples: int | None = 100, seed: int = 0,
                     oracle: bool = False) -> Normalizer:
    """The unfitted normaliser for a test-time ``name``, from the registry of :mod:`xmodal.normalize`.

    One construction path for the trainer, ``xmodal normalize``/``eval`` and ``bench/``.
    Each keyword goes to the normalisers that take it (``temperature``: Sinkhorn/DSL;
    ``iters``: Sinkhorn; ``lam``/``num_samples``/``seed``: DN; ``k``: QB-Norm; ``beta``:
    QB-Norm/IS).

    >>> build_normalizer("ncl", temperature=0.05, iters=4)
    SinkhornBias(temperature=0.05, iters=4, oracle=False, block_size=None, track_error=True)
    """
    name = _canonical(name, "name")
    method = _METHODS[name][0]
    from xmodal._validate import flag

    oracle = flag(oracle, "oracle") or _METHODS[name][1] == "queries"
    kwargs: dict[str, Any] = {
        "none": {}, "dn": {"lam": lam, "num_samples": num_samples, "seed": seed, "oracle": oracle},
        "sinkhorn": {"temperature": temperature, "iters": iters, "oracle": oracle},
        "qbnorm": {"k": k, "beta": beta, "oracle": oracle}, "is": {"beta": beta, "oracle": oracle},
        "dsl": {"temperature": temperature, "oracle": oracle},
    }[method]
    return _registry_build(method, **kwargs)


def fit_normalizer(name: str, queries: Any, gallery: Any, bank: Any | None = None, *, oracle: bool = False,
                   gallery_marginal: Any = None, **hparams: Any) -> Normalizer:
    """Build and fit ``name`` on ``bank`` (the test ``queries`` when ``oracle``, or when no bank is
    given to DN/DSL) against ``gallery``. ``hparams``: as :func:`build_normalizer`.

    Shape:
        queries ``[Q, D]``, gallery ``[N, D]``, bank ``[K, D]``.

    >>> q, g = torch.eye(3), torch.eye(3)
    >>> fit_normalizer("sinkhorn", q, g, q, temperature=0.1).bias.shape
    torch.Size([3])
    """
    from xmodal._validate import flag

    key = _canonical(name, "name")
    oracle = flag(oracle, "oracle")
    if oracle or _METHODS[key][1] == "queries" or (bank is None and key in ("dn", "dsl")):
        bank, oracle = queries, True
    elif bank is None:
        raise ValueError(f"bank: normaliser {name!r} needs a query bank (or oracle=True)")
    norm = build_normalizer(key, oracle=oracle, **hparams)
    if gallery_marginal is not None:
        return norm.fit(bank, gallery, gallery_marginal=gallery_marginal)
    return norm.fit(bank, gallery)


@dataclass
class TestTime:
    """The fitted test-time normalisers of a run (``model.test_time``).

    Attributes:
        temperature: the model's test temperature (Sinkhorn / DSL ``gamma``).
        hparams: ``iters``, ``lam``, ``k``, ``beta``, ``num_samples`` shared by the normalisers,
            and ``dn_source`` (``train``/``val``: where DN's means came from; a record only),
            ``heldout`` (``"pairs"``: row ``i`` of ``banks["heldout"]``'s videos is the video of its
            text ``i``; runs before it stored an unrelated sample of videos).
        banks: ``{"train": (text_queries, video_queries), "ncl": (...)}`` embedded train queries.
        dn: DN's fitted state (``DistributionNormalization.state_dict()``), or None.
        names: the fitted candidates, in selection order.
        selected: the name chosen on validation (never one that uses test queries).
        val: validation metrics per name, ``{name: {"t2v": ..., "v2t": ...}}``.
        selection: how ``selected`` was chosen (:func:`xmodal.retrieval.selection.select_normalizer`:
            the rule, each candidate's paired test against ``none``, the normaliser an index folds).
    """

    __test__ = False  # not a pytest class

    temperature: float = 0.05
    hparams: dict = field(default_factory=dict)
    banks: dict = field(default_factory=dict)
    dn: dict | None = None
    names: tuple = ("none",)
    selected: str = "none"
    val: dict = field(default_factory=dict)
    selection: dict = field(default_factory=dict)

    def _hp(self) -> dict:
        return {"temperature": self.temperature, **{k: v for k, v in self.hparams.items() if k not in RECORDS}}

    def resolve(self, normalizer: str) -> str:
        """``"selected"`` -> the selected name; checks the name is fitted."""
        if normalizer == "selected":
            return self.selected
        key = _canonical(normalizer)
        if key not in self.names and key not in ORACLE_NAMES and key != "none":
            raise ValueError(f"normalizer: {normalizer!r} was not fitted for this run; "
                             f"expected selected, none or one of {', '.join(self.names)}")
        return key

    def similarities(self, text: torch.Tensor, video: torch.Tensor, normalizer: str = "selected"
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(t2v [T, V], v2t [V, T] or None = t2v transposed)`` scores of L2-normalised embeddings."""
        name = self.resolve(normalizer)
        sim = text @ video.T
        if name == "none":
            return sim, None
        if name == "dn":
            if self.dn is None:
                raise ValueError("normalizer: 'dn' has no fitted state in this run")
            from xmodal.normalize import DistributionNormalization

            q, g = DistributionNormalization.from_state_dict(self.dn).transform(text, video)
            return q @ g.T, None
        if name == "dsl":
            dsl = build_normalizer("dsl", **self._hp())
            return torch.as_tensor(dsl(sim)), torch.as_tensor(dsl(sim.T.contiguous()))
        bank = _METHODS[name][1]
        if bank == "queries":
            bank_t, bank_v = text, video
        else:
            if bank not in self.banks:
                raise ValueError(f"normalizer: {name!r} needs the {bank!r} query bank, which this run lacks")
            bank_t, bank_v = (b.to(text) for b in self.banks[bank])
        n_t2v = fit_normalizer(name, text, video, bank_t, **self._hp())
        n_v2t = fit_normalizer(name, video, text, bank_v, **self._hp())
        return torch.as_tensor(n_t2v(sim)), torch.as_tensor(n_v2t(sim.T.contiguous()))

    def similarity(self, text: torch.Tensor, video: torch.Tensor, normalizer: str = "selected",
                   direction: str = "t2v") -> torch.Tensor:
        """Normalised scores of one retrieval direction: ``t2v`` ``[T, V]`` or ``v2t`` ``[V, T]``."""
        if direction not in ("t2v", "v2t"):
            raise ValueError(f"direction: expected 't2v' or 'v2t', got {short_repr(direction)}")
        t2v, v2t = self.similarities(text, video, normalizer)
        if direction == "t2v":
            return t2v
        return t2v.T if v2t is None else v2t

    # -- serialisation (weights-only loadable) ------------------------------------------
    def state_dict(self) -> dict:
        return {"version": 1, "temperature": float(self.temperature), "hparams": dict(self.hparams),
                "banks": {k: [t.detach().cpu(), v.detach().cpu()] for k, (t, v) in self.banks.items()},
                "dn": self.dn, "names": list(self.names), "selected": self.selected, "val": self.val,
                "selection": dict(self.selection)}

    @classmethod
    def from_state_dict(cls, state: dict | None) -> "TestTime":
        if state is None:
            return cls()
        if not isinstance(state, dict):
            raise TypeError(f"state: expected a dict, got {type(state).__name__}")
        if not state:
            return cls()
        if "version" not in state:
            return _check_state(_from_legacy(state))
        return _check_state(cls(temperature=float(state["temperature"]), hparams=dict(state.get("hparams", {})),
                                banks={k: (v[0], v[1]) for k, v in state.get("banks", {}).items()},
                                dn=state.get("dn"), names=tuple(state.get("names", ("none",))),
                                selected=state.get("selected", "none"), val=dict(state.get("val", {})),
                                selection=dict(state.get("selection") or {})))

    # -- read access of the former dict form ---------------------------------------------
    def __getitem__(self, key: str) -> Any:
        legacy = {"normalizer": self.selected, "val": self.val, "temperature": self.temperature}
        if key not in legacy:
            raise KeyError(key)
        return legacy[key]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


def _check_state(tt: TestTime) -> TestTime:
    """A stored test-time record is checked when read: known, fitted names, a selected one
    among them, a positive temperature and hyper-parameters the normalisers accept."""
    import math

    from xmodal.normalize import QBNorm, SinkhornBias

    names = tuple(_canonical(n, "test_time.names") for n in tt.names)
    if tt.selected != "none" and _canonical(tt.selected, "test_time.selected") not in names:
        raise ValueError(f"test_time.selected: {tt.selected!r} is not one of the fitted normalisers "
                         f"({', '.join(names)})")
    if not (math.isfinite(tt.temperature) and tt.temperature > 0):
        raise ValueError(f"test_time.temperature: must be a positive number, got {tt.temperature}")
    hp = tt.hparams
    try:
        SinkhornBias(tt.temperature, iters=hp.get("iters", 4))
        QBNorm(k=hp.get("k", 1), beta=hp.get("beta", 20.0))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"test_time.hparams: {exc}") from None
    tt.names = names
    return tt


def _from_legacy(d: dict) -> TestTime:
    """A run written before :class:`TestTime` (a dict of banks and keywords)."""
    kw = d.get("kwargs", {})
    hp = {"iters": kw.get("sinkhorn", {}).get("iters", 4), "lam": kw.get("dn", {}).get("lam", 0.25),
          "k": kw.get("qbnorm", {}).get("k", 1), "beta": kw.get("qbnorm", {}).get("beta", 20.0)}
    banks = {}
    if "text_bank" in d and "video_bank" in d:
        banks["train"] = (d["text_bank"], d["video_bank"])
    if "ncl_text_bank" in d:
        banks["ncl"] = (d["ncl_text_bank"], d["ncl_video_bank"])
    names = tuple(d.get("val", {})) or (d.get("normalizer", "none"),)
    tt = TestTime(temperature=float(d.get("temperature", 0.05)), hparams=hp, banks=banks,
                  names=tuple(n for n in names if n == "none" or _METHODS.get(n, ("", "x"))[1] in
                              (None, "queries", *banks)),
                  val=dict(d.get("val", {})))
    if "dn" in tt.names and "train" in banks:
        tt.dn = build_normalizer("dn", lam=hp["lam"]).fit(*banks["train"]).state_dict()
    tt.selected = d.get("normalizer", "none") if d.get("normalizer", "none") in tt.names else "none"
    return tt


def _bank(x: Any, name: str) -> torch.Tensor:
    """A detached float32 CPU copy of a ``[K, D]`` bank of embeddings (numpy or torch)."""
    from xmodal._validate import float_matrix

    return float_matrix(x, name, allow_empty=True, finite=False).detach().float().cpu()


def _bank_pair(pair: Any, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """None, or a ``(texts, videos)`` pair of banks."""
    if pair is None:
        return None
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name}: expected a pair (texts, videos) of [K, D] banks, got {type(pair).__name__}")
    return _bank(pair[0], f"{name}[0]"), _bank(pair[1], f"{name}[1]")


def fit_test_time(names: list[str] | tuple[str, ...], *, text_bank: torch.Tensor, video_bank: torch.Tensor,
                  ncl_bank: tuple[torch.Tensor, torch.Tensor] | None = None, temperature: float,
                  iters: int = 4, lam: float = 0.25, k: int = 1, beta: float = 20.0,
                  dn_bank: tuple[torch.Tensor, torch.Tensor] | None = None, dn_num_samples: int | None = 100,
                  dn_seeds: int = 1, dn_source: str = "train",
                  heldout_bank: tuple[torch.Tensor, torch.Tensor] | None = None,
                  heldout_pairs: bool = False) -> TestTime:
    """Fit the candidate normalisers ``names`` once (``ncl`` is dropped without ``ncl_bank``).

    Args:
        names: candidate names (``none`` is always kept).
        text_bank, video_bank: train queries embedded by the final model, ``[K, D]``; both None: no train
            split (a zero-shot run on val / test alone), so the normalisers fitted on them are left out.
        ncl_bank: the NCL loss's queues ``(text_queries, video_queries)`` (``NCL.query_bank()``).
        temperature, iters, lam, k, beta: normaliser hyper-parameters.
        dn_bank: ``(texts, videos)`` DN's means are estimated from; None: the train banks.
            The trainer passes the validation embeddings for ``test_time.dn_source: val``
            (the DN paper's protocol, sec. 4.3: 100 random unlabeled validation samples).
        dn_num_samples, dn_seeds: DN's sample size and number of sampling seeds whose
            means are averaged (:class:`~xmodal.normalize.DistributionNormalization`).
        dn_source: recorded in ``hparams`` (``train`` or ``val``), nothing else.
        heldout_bank: ``(texts, videos)`` train queries embedded by the final model that no
            normaliser is fitted on, stored as ``banks["heldout"]``: the queries an approximate
            index measures its recall on (:func:`xmodal.retrieval.build.write_index`), so the
            recall is not measured on the very queries a Sinkhorn bias was fitted to.
        heldout_pairs: row ``i`` of the held-out videos is the video of text ``i`` (recorded as
            ``hparams["heldout"] = "pairs"``): the index build then measures, on these captions with
            their videos added to its gallery, whether folding the normaliser helps text -> video.

    >>> g = torch.Generator().manual_seed(0)
    >>> t, v = torch.randn(20, 4, generator=g), torch.randn(20, 4, generator=g)
    >>> tt = fit_test_time(["none", "dn", "ncl"], text_bank=t, video_bank=v, temperature=0.05)
    >>> tt.names, tt.dn["name"]
    (('none', 'dn'), 'dn')
    """
    from xmodal._validate import finite_number, option, positive_int, positive_number, short_repr, whole_number

    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names: expected a list of normaliser names, got {short_repr(names)}")
    temperature = positive_number(temperature, "temperature")
    iters, k = whole_number(iters, "iters"), whole_number(k, "k", minimum=1)
    lam, beta = finite_number(lam, "lam"), finite_number(beta, "beta")
    dn_seeds = positive_int(dn_seeds, "dn_seeds")
    if dn_num_samples is not None:
        positive_number(dn_num_samples, "dn_num_samples")
    dn_source = option(dn_source, "dn_source", ("train", "val"))
    if (text_bank is None) != (video_bank is None):
        raise ValueError("text_bank, video_bank: give both train banks, or neither (no train split)")
    banks = {} if text_bank is None else {"train": (_bank(text_bank, "text_bank"), _bank(video_bank, "video_bank"))}
    ncl = _bank_pair(ncl_bank, "ncl_bank")
    if ncl is not None and len(ncl[0]) and len(ncl[1]):
        banks["ncl"] = ncl
    held = _bank_pair(heldout_bank, "heldout_bank")
    if held is not None and len(held[0]):
        banks["heldout"] = held
    from xmodal._validate import flag

    heldout_pairs = flag(heldout_pairs, "heldout_pairs")
    if heldout_pairs and "heldout" in banks and len(banks["heldout"][0]) != len(banks["heldout"][1]):
        raise ValueError("heldout_bank: paired held-out texts and videos must have as many rows")
    dn_bank = _bank_pair(dn_bank, "dn_bank")
    keep = []
    for n in ["none", *names]:
        key = _canonical(n, "names")
        fitted = _METHODS[key][1] in (None, "queries") or _METHODS[key][1] in banks \
            or (key == "dn" and dn_bank is not None)
        if key not in keep and fitted:
            keep.append(key)
    hparams = {"iters": int(iters), "lam": float(lam), "k": int(k), "beta": float(beta), "dn_source": str(dn_source)}
    if heldout_pairs and "heldout" in banks:
        hparams["heldout"] = "pairs"
    tt = TestTime(temperature=float(temperature), hparams=hparams,
                  banks=banks, names=tuple(keep))
    if "dn" in keep:
        from xmodal.normalize import DistributionNormalization

        source = banks["train"] if dn_bank is None else dn_bank
        tt.dn = DistributionNormalization(lam=lam, num_samples=dn_num_samples, seeds=dn_seeds).fit(
            *source).state_dict()
    return tt


def select(test_time: TestTime, val: dict[str, dict], score) -> str:
    """The best name on validation by ``score(metrics)`` among those not using test queries
    (ties prefer ``none``, then the earlier name): the ``best`` rule. The trainer's default rule
    (a candidate must beat ``none`` by more than the per-query spread) is
    :func:`xmodal.retrieval.selection.select_normalizer`."""
    ok = [n for n in test_time.names if not uses_test_queries(n) and n in val]
    order = {n: i for i, n in enumerate(ok)}
    return max(ok, key=lambda n: (score(val[n]), n == "none", -order[n])) if ok else "none"

