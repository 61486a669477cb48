"""Zero-shot classification (``xmodal classify``): class names x prompt templates, CLIP's prompt
ensembling, top-1 / top-5 with and without DN (:mod:`xmodal.classify.zeroshot`), the templates
(:mod:`xmodal.classify.templates`) and the run folder ``xmodal compare`` reads (:mod:`xmodal.classify.run`)."""

from xmodal.classify.run import classify, read_labelled
from xmodal.classify.templates import CLIP_IMAGENET_TEMPLATES, get_templates, prompts, read_class_names
from xmodal.classify.zeroshot import class_embeddings, class_ranks, dn_normalizers, topk

__all__ = ["classify", "read_labelled", "CLIP_IMAGENET_TEMPLATES", "get_templates", "prompts", "read_class_names",
           "class_embeddings", "class_ranks", "dn_normalizers", "topk"]
