"""Retrieval evaluation: exact rank metrics with stated tie rules, EPIC-KITCHENS-100 MIR
mAP/nDCG, diagnostics (normalisation error, modality gap, hubness), a streaming
evaluator over embeddings, per-group (head/tail) breakdowns, retrieval-mass analysis
(NCL Fig. 3) and the papers' other evaluations (linear probe, zero-shot, label
retrieval, CLIPScore), and paired tests of two results on the same queries (bootstrap
interval, sign-flip p-value, Holm). Percentages for R@K/mAP/nDCG/accuracy, 1-based ranks (API.md)."""

from xmodal.metrics.caption import caption_score, kendall_tau
from xmodal.metrics.diagnostics import hubness, k_occurrence, modality_gap, normalization_error
from xmodal.metrics.formatting import format_metric, markdown_table, metric_digits
from xmodal.metrics.groups import epic_tail_classes, head_tail_groups, mir_by_group, retrieval_by_group
from xmodal.metrics.mass import fn_fp_by_mass, item_error_counts, retrieval_mass
from xmodal.metrics.multi_instance import mir, mir_per_query
from xmodal.metrics.paired import bootstrap_interval, holm, paired_strata_test, paired_test
from xmodal.metrics.probe import label_retrieval, linear_probe, zero_shot
from xmodal.metrics.ranking import query_ranks, retrieval, text_video, text_video_ranks
from xmodal.metrics.streaming import streaming_retrieval, streaming_text_video

__all__ = ["retrieval", "text_video", "mir", "normalization_error", "modality_gap", "hubness",
           "k_occurrence", "streaming_retrieval", "streaming_text_video",
           "retrieval_by_group", "mir_by_group", "head_tail_groups", "epic_tail_classes",
           "retrieval_mass", "item_error_counts", "fn_fp_by_mass",
           "linear_probe", "zero_shot", "label_retrieval", "caption_score", "kendall_tau",
           "format_metric", "metric_digits", "markdown_table", "query_ranks", "text_video_ranks",
           "mir_per_query", "paired_test", "paired_strata_test", "bootstrap_interval", "holm"]
