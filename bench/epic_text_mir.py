"""Text-text MIR sanity run on EPIC-KITCHENS-100 (issue 2, "What it must show").

MiniLM embeddings of the 9,668 test clip narrations vs the 3,842 test sentences,
similarity = dot product (unit vectors: cosine), relevancy from
``xmodal.data.epic_relevancy`` (mean of verb- and noun-class IoU), mAP / nDCG from
``xmodal.metrics.mir`` in both directions (clip -> sentence rows, sentence -> clip
columns; the EPIC leaderboard averages the two). A narration is a perfect description
of its own clip, so this is an upper-bound-like sanity check of relevancy + metric,
not a video result.

    .venv/bin/python bench/epic_text_mir.py [--root ../shared/data/epic100] [--save-dir DIR]

``--save-dir`` writes ``sim.npy`` and ``relevancy.npy`` (outside the repository!) for
``xmodal eval``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(REPO / ".." / "shared" / "data" / "epic100"))
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--save-dir", default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--markdown", action="store_true", help="print the times and the results as Markdown tables "
                   "(what bench/resultfile.py --run parses into a docs result file)")
    args = p.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"skipped: EPIC-KITCHENS-100 CSVs not found at {root}")
        return 0
    from xmodal.data import epic_relevancy
    from xmodal.features.encoders import encode_text
    from xmodal.metrics import mir

    t0 = time.perf_counter()
    rel, clips, sents = epic_relevancy(root, "test")
    t_rel = time.perf_counter() - t0

    # Encode each distinct text once (9,668 narrations hold only ~3.8k distinct strings).
    t0 = time.perf_counter()
    texts = sorted(set(clips) | set(sents))
    emb = encode_text(texts, batch_size=args.batch_size, progress=not args.quiet)
    index = {t: i for i, t in enumerate(texts)}
    clip_emb = emb[[index[t] for t in clips]]
    sent_emb = emb[[index[t] for t in sents]]
    t_enc = time.perf_counter() - t0

    t0 = time.perf_counter()
    sim = clip_emb @ sent_emb.T  # [clips, sentences]
    t_sim = time.perf_counter() - t0

    t0 = time.perf_counter()
    res = mir(sim, rel, directions="both")
    t_mir = time.perf_counter() - t0

    print(f"EPIC-KITCHENS-100 MIR test, text-text sanity run (MiniLM narrations vs sentences)")
    print(f"clips x sentences: {rel.shape[0]} x {rel.shape[1]}; distinct texts encoded: {len(texts)}")
    rows = (("clip -> sentence", res["mAP_rows"], res["nDCG_rows"]), ("sentence -> clip", res["mAP_cols"],
            res["nDCG_cols"]), ("average", res["mAP"], res["nDCG"]))
    if args.markdown:
        print("\n| direction | mAP | nDCG |\n|---|---:|---:|")
        print("\n".join(f"| {name} | {m:.2f} | {n:.2f} |" for name, m, n in rows))
        print(f"\n| stage | seconds |\n|---|---:|\n| relevancy | {t_rel:.2f} |\n| encoding | {t_enc:.2f} |\n"
              f"| similarity | {t_sim:.2f} |\n| mir | {t_mir:.2f} |\n")
    else:
        print(f"relevancy: {t_rel:.2f} s | encoding: {t_enc:.1f} s | similarity: {t_sim:.2f} s | mir: {t_mir:.2f} s")
        print(f"{'direction':<22}{'mAP':>8}{'nDCG':>8}")
        for name, m, n in rows:
            print(f"{name:<22}{m:>8.2f}{n:>8.2f}")
    if args.save_dir:
        out = Path(args.save_dir)
        if out.resolve().is_relative_to(REPO.resolve()):
            print("--save-dir: refusing to write data inside the repository", file=sys.stderr)
            return 2
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "sim.npy", sim.astype(np.float32))
        np.save(out / "relevancy.npy", rel)
        print(f"wrote {out / 'sim.npy'} and {out / 'relevancy.npy'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
