"""Retrieval evaluation: exact rank metrics with stated tie rules, EPIC-KITCHENS-100 MIR
mAP/nDCG, diagnostics (normalisation error, modality gap, hubness) and a streaming
evaluator over embeddings. Percentages for R@K/mAP/nDCG, 1-based ranks (API.md)."""

from xmodal.metrics.multi_instance import mir
from xmodal.metrics.ranking import retrieval, text_video

__all__ = ["retrieval", "text_video", "mir"]
