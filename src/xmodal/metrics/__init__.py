"""Retrieval evaluation: exact rank metrics with stated tie rules, EPIC-KITCHENS-100 MIR
mAP/nDCG, diagnostics (normalisation error, modality gap, hubness) and a streaming
evaluator over embeddings. Percentages for R@K/mAP/nDCG, 1-based ranks (API.md)."""

from xmodal.metrics.diagnostics import hubness, k_occurrence, modality_gap, normalization_error
from xmodal.metrics.multi_instance import mir
from xmodal.metrics.ranking import retrieval, text_video
from xmodal.metrics.streaming import streaming_retrieval, streaming_text_video

__all__ = ["retrieval", "text_video", "mir", "normalization_error", "modality_gap", "hubness",
           "k_occurrence", "streaming_retrieval", "streaming_text_video"]
