"""Does the staged fold check (issue 43 item 2) decide as the whole-gallery measurement does?

    .venv/bin/python bench/fold_stages.py

Seeded galleries of 100,000 random unit videos (32-d) and 1,000 captions, each with its own video (added
to the gallery) and a distractor near it in the gallery. A Sinkhorn bank of 3,000 queries: for a fraction
of the captions the bank keeps retrieving the distractors (``helps``: the fold lowers their bias, the
captions' own videos rise) or the captions' own videos (the fold lowers them); the rest of the bank is
random. The strength of the effect varies with that fraction and the distractors' distance. For each:
the whole-gallery decision (:func:`xmodal.retrieval.foldcheck.choose_fold` with Sinkhorn fitted on all
100,000 rows, every caption) and the staged one (:func:`~xmodal.retrieval.foldcheck.choose_on_sample`,
:data:`~xmodal.retrieval.foldcheck.STAGES`, 20,000 sampled rows last), with each stage's interval.
Nothing is asserted (``tests/test_index_fold_sample.py`` checks the same on small seeded data).
"""

from __future__ import annotations

import numpy as np
import torch


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def scenario(helps: bool, n: int, d: int, m: int, hub_noise: float, frac: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    own = unit(rng.standard_normal((m, d)))
    cap = unit(own + 0.5 / d ** 0.5 * rng.standard_normal((m, d)))
    hubs = unit(cap + hub_noise / d ** 0.5 * rng.standard_normal((m, d)))
    g = np.vstack([unit(rng.standard_normal((n - m, d))), hubs])[rng.permutation(n)]
    k = int(frac * m)
    popular = hubs[:k] if helps else own[:k]
    bank = np.vstack([unit(np.repeat(popular, 3, 0) + 0.1 / d ** 0.5 * rng.standard_normal((3 * k, d))),
                      unit(rng.standard_normal((3 * (m - k), d)))])
    return (torch.from_numpy(x) for x in (g, bank, cap, own))


def main() -> None:
    torch.set_num_threads(1)
    from xmodal.retrieval.foldcheck import STAGES, choose_fold, choose_on_sample
    from xmodal.retrieval.index import gallery_bias

    n, m, d = 100_000, 1_000, 32
    print(f"stages {STAGES}, then {m:,} captions on 20,000 rows; gallery {n:,} x {d}")
    print("| distractor noise | bank fraction | fold | whole gallery: chosen, diff [CI] | staged: chosen | stages "
          "(captions: diff [CI]) | same |")
    print("|---|---|---|---|---|---|---|")
    for hub_noise, frac in ((0.45, 0.1), (0.45, 0.05), (0.8, 0.3), (0.3, 0.02)):
        for helps in (True, False):
            g, bank, cap, own = scenario(helps, n, d, m, hub_noise, frac)

            def fit(rows, extra, bank=bank):
                b, xb = gallery_bias("sinkhorn", rows, bank, extra=extra, temperature=0.05, iters=4)
                return {"normalizer": "sinkhorn", "bias": b, "extra_bias": xb, "query_shift": None}

            t2v = n + np.arange(m)
            full = choose_fold(g, fit(g, own), cap, t2v, extra=own, n_boot=2000)
            rec, _ = choose_on_sample(g, fit, cap, t2v, extra=own, size=20_000, n_boot=2000)
            t = full["test"]
            stages = "; ".join(f"{s['queries']}: {s['diff']:+.1f} [{s['ci_low']:.1f}, {s['ci_high']:.1f}]"
                               for s in rec["stages"])
            print(f"| {hub_noise} | {frac} | {'helps' if helps else 'hurts'} | {full['chosen']}, {t['diff']:+.1f} "
                  f"[{t['ci_low']:.1f}, {t['ci_high']:.1f}] | {rec['chosen']} | {stages} | "
                  f"{rec['chosen'] == full['chosen']} |", flush=True)


if __name__ == "__main__":
    main()
