"""Cross-modal contrastive losses (``nn.Module`` wrappers over :mod:`xmodal.functional`).

``LOSSES`` maps lower-case names to classes; :func:`build_loss` instantiates one.
Every class has ``accepts``: the optional ``forward`` keywords it understands.
"""

from __future__ import annotations

from torch import nn

from xmodal.losses.dcl import DebiasedContrastive
from xmodal.losses.infonce import InfoNCE
from xmodal.losses.maxmargin import MaxMargin
from xmodal.losses.milnce import MILNCE
from xmodal.losses.mimaxmargin import MIMaxMargin
from xmodal.losses.ntxent import NTXent

LOSSES: dict[str, type[nn.Module]] = {
    "infonce": InfoNCE,
    "ntxent": NTXent,
    "maxmargin": MaxMargin,
    "mimaxmargin": MIMaxMargin,
    "milnce": MILNCE,
    "dcl": DebiasedContrastive,
}


def build_loss(name: str, **kwargs) -> nn.Module:
    """Instantiate ``LOSSES[name.lower()](**kwargs)``.

    Raises:
        ValueError: unknown ``name``.
    """
    key = str(name).lower()
    if key not in LOSSES:
        raise ValueError(f"name: unknown loss {name!r}; expected one of {', '.join(sorted(LOSSES))}")
    return LOSSES[key](**kwargs)


__all__ = ["LOSSES", "build_loss", "InfoNCE", "NTXent", "MaxMargin", "MIMaxMargin", "MILNCE",
           "DebiasedContrastive"]

# LOSSES-PAPER losses (appended; keep at the end so the base block stays untouched).
from xmodal.losses.calince import CaliNCE  # noqa: E402
from xmodal.losses.crossclr import CrossCLR  # noqa: E402
from xmodal.losses.ncl import NCL  # noqa: E402

LOSSES.update({"crossclr": CrossCLR, "ncl": NCL, "calince": CaliNCE})
__all__ += ["CrossCLR", "NCL", "CaliNCE"]
