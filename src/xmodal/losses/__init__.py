"""Cross-modal contrastive losses (``nn.Module`` wrappers over :mod:`xmodal.functional`).

``LOSSES`` maps lower-case names to classes; :func:`build_loss` instantiates one.

What a loss needs is declared once, beside the loss, as two class attributes, and read
through :func:`loss_spec` by the trainer, ``xmodal bench`` and the config checks:

- ``accepts``: the optional ``forward`` keywords it understands (``ids``,
  ``temperature``, ``margin``, ``video_input``, ``text_input``, ``relevancy``).
- ``scheduled``: the constructor/forward quantity a TS++ schedule drives:
  ``"temperature"`` or ``"margin"`` (a float or per-sample ``[B]`` tensor),
  ``"temperature:per_step"`` (a float per step only), or ``None``.

Losses whose constructor needs values from the model (Cali-NCE's correspondence head:
``embed_dim``, ``input_dims``; its private generator: ``seed``) name them when registered.
A new loss is one file plus one :func:`register` line here.
"""

from __future__ import annotations

from xmodal._validate import short_repr

from dataclasses import dataclass

from torch import nn

from xmodal.losses.calince import CaliNCE
from xmodal.losses.crossclr import CrossCLR
from xmodal.losses.dcl import DebiasedContrastive
from xmodal.losses.infonce import InfoNCE
from xmodal.losses.maxmargin import MaxMargin
from xmodal.losses.milnce import MILNCE
from xmodal.losses.mimaxmargin import MIMaxMargin
from xmodal.losses.ncl import NCL
from xmodal.losses.ntxent import NTXent

LOSSES: dict[str, type[nn.Module]] = {}
_MODEL_KWARGS: dict[str, tuple[str, ...]] = {}
MODEL_KWARGS = ("embed_dim", "input_dims", "seed")


@dataclass(frozen=True)
class LossSpec:
    """What one loss needs, read from its declaration.

    Attributes:
        name: registry key.
        accepts: optional forward keywords.
        keyword: the scheduled quantity (``temperature``/``margin``) or None.
        per_sample: the scheduled quantity may be a per-sample ``[B]`` tensor.
        model_kwargs: constructor keywords the trainer fills from the model/run.
    """

    name: str
    accepts: tuple[str, ...]
    keyword: str | None
    per_sample: bool
    model_kwargs: tuple[str, ...]


def register(name: str, cls: type[nn.Module], *, model_kwargs: tuple[str, ...] = ()) -> type[nn.Module]:
    """Add ``cls`` to :data:`LOSSES` under ``name`` (checks its declaration)."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError("name: expected a non-empty string")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError("cls: expected a torch.nn.Module subclass")
    bad = [k for k in model_kwargs if k not in MODEL_KWARGS]
    if bad:
        raise ValueError(f"model_kwargs: unknown {bad}; expected some of {MODEL_KWARGS}")
    _spec_of(name, cls, tuple(model_kwargs))
    LOSSES[name] = cls
    _MODEL_KWARGS[name] = tuple(model_kwargs)
    return cls


def _spec_of(name: str, cls: type, model_kwargs: tuple[str, ...]) -> LossSpec:
    scheduled = getattr(cls, "scheduled", None)
    keyword, _, scope = (scheduled or "").partition(":")
    if scheduled is not None and (keyword not in ("temperature", "margin") or scope not in ("", "per_step")):
        raise ValueError(f"{cls.__name__}.scheduled: expected 'temperature', 'margin', "
                         f"'temperature:per_step' or None, got {short_repr(scheduled)}")
    return LossSpec(name, tuple(getattr(cls, "accepts", ())), keyword or None, scope != "per_step",
                    model_kwargs)


def loss_spec(name: str) -> LossSpec:
    """The declaration of the loss registered under ``name``.

    >>> loss_spec("maxmargin").keyword, loss_spec("ncl").per_sample
    ('margin', False)
    """
    key = str(name).lower()
    if key not in LOSSES:
        raise ValueError(f"name: unknown loss {short_repr(name)}; expected one of {', '.join(sorted(LOSSES))}")
    return _spec_of(key, LOSSES[key], _MODEL_KWARGS[key])


def build_loss(name: str, **kwargs) -> nn.Module:
    """Instantiate ``LOSSES[name.lower()](**kwargs)``.

    Raises:
        ValueError: unknown ``name``.
    """
    key = str(name).lower()
    if key not in LOSSES:
        raise ValueError(f"name: unknown loss {short_repr(name)}; expected one of {', '.join(sorted(LOSSES))}")
    return LOSSES[key](**kwargs)


register("infonce", InfoNCE)
register("ntxent", NTXent)
register("maxmargin", MaxMargin)
register("mimaxmargin", MIMaxMargin)
register("milnce", MILNCE)
register("dcl", DebiasedContrastive)
register("crossclr", CrossCLR)
register("ncl", NCL)
register("calince", CaliNCE, model_kwargs=("embed_dim", "input_dims", "seed"))

__all__ = ["LOSSES", "LossSpec", "build_loss", "loss_spec", "register", "InfoNCE", "NTXent", "MaxMargin",
           "MIMaxMargin", "MILNCE", "DebiasedContrastive", "CrossCLR", "NCL", "CaliNCE"]
