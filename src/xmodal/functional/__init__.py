"""Functional (stateless, pure tensor) forms of the losses; modules in :mod:`xmodal.losses`."""

from xmodal.functional.dcl import debiased_contrastive
from xmodal.functional.infonce import info_nce
from xmodal.functional.maxmargin import max_margin
from xmodal.functional.milnce import mil_nce
from xmodal.functional.mimaxmargin import mi_max_margin
from xmodal.functional.ntxent import nt_xent
from xmodal.functional.calince import calibrated_nce, correspondence_loss, predictive_coding_loss
from xmodal.functional.crossclr import crossclr_loss
from xmodal.functional.ncl import ncl_biases, ncl_loss
from xmodal.functional.sinkhorn import log_sinkhorn

__all__ = ["calibrated_nce", "correspondence_loss", "crossclr_loss", "debiased_contrastive", "info_nce",
           "log_sinkhorn", "max_margin", "mi_max_margin", "mil_nce", "ncl_biases", "ncl_loss", "nt_xent",
           "predictive_coding_loss"]
