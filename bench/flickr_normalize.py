"""Test-time normalisers on real data: Flickr8k dev with a linear two-tower InfoNCE model.

Trains linear 256-d heads on the frozen Flickr8k features (train split; inputs
standardised with train statistics; symmetric InfoNCE with a learned temperature,
Adam 1e-3, batch 256, early stop on dev text-to-image R@1, seeded), then reports
text-to-image and image-to-text R@1/5/10/MdR/MnR and the normalisation error on
dev for: none, DN, NCL Sinkhorn with a train-query bank, NCL oracle (dev queries
as the bank), QB-Norm (train bank), IS (train bank) and DSL (dev queries).

Choices: the train bank for text-to-image is every train caption (30,000); for
image-to-text every train image (6,000). Sinkhorn and DSL use the learned
temperature, 4 Sinkhorn iterations (``--sinkhorn-iters``), uniform marginals. DN estimates the query
mean from 100 train-bank queries and the gallery mean from 100 dev gallery items
(lambda 0.25), so it uses no test query. QB-Norm k=1, beta=20; IS beta=20.
Image-to-text counts a hit when any of the image's 5 captions is retrieved
("all-captions"). The normalisation error uses the learned temperature on the
normalised scores (QB-Norm / IS in similarity units; DSL's scores are
``sim * prior``, a different scale).

Usage: ``python bench/flickr_normalize.py [--data ../shared/data/flickr8k] [--epochs 10]``.
Skips with a message when the data directory is absent.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from torch import nn

DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "flickr8k")


def load_split(root: str, split: str):
    """(image features, caption features, caption -> image) as float32/int64 arrays."""
    try:
        from xmodal.data import load_paired_split
    except ImportError:
        load_paired_split = None
    if load_paired_split is not None:
        s = load_paired_split(root, split, captions=False)
        return s.video.astype(np.float32), s.text.astype(np.float32), s.text_to_video.astype(np.int64)
    return (np.load(os.path.join(root, f"{split}_image_features.npy")).astype(np.float32),
            np.load(os.path.join(root, f"{split}_caption_features.npy")).astype(np.float32),
            np.load(os.path.join(root, f"{split}_caption_to_image.npy")).astype(np.int64))


def make_loss(init_temperature: float) -> nn.Module:
    try:
        from xmodal.losses import InfoNCE
        return InfoNCE(temperature=init_temperature, learnable=True)
    except ImportError:  # pragma: no cover - the losses engineer's module is expected
        raise SystemExit("xmodal.losses.InfoNCE is required") from None


def t2i_r1(img_emb: torch.Tensor, cap_emb: torch.Tensor, c2i: np.ndarray) -> float:
    from xmodal.metrics import retrieval
    return retrieval(cap_emb @ img_emb.T, c2i, ks=(1,))["R@1"]


def train(data, *, dim: int, epochs: int, patience: int, seed: int, lr: float, batch: int):
    (tr_img, tr_cap, tr_c2i), (dv_img, dv_cap, dv_c2i) = data
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    img_head, cap_head = nn.Linear(tr_img.shape[1], dim), nn.Linear(tr_cap.shape[1], dim)
    loss_fn = make_loss(0.07)
    params = list(img_head.parameters()) + list(cap_head.parameters()) + list(loss_fn.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    ti, tc, dvi, dvc = map(torch.from_numpy, (tr_img, tr_cap, dv_img, dv_cap))
    c2i = torch.from_numpy(tr_c2i)
    best, best_state, bad, log = -1.0, None, 0, []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        order = torch.from_numpy(rng.permutation(tc.shape[0]))
        for start in range(0, len(order) - batch + 1, batch):
            rows = order[start:start + batch]
            ids = c2i[rows]
            loss = loss_fn(img_head(ti[ids]), cap_head(tc[rows]), ids=ids)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            r1 = t2i_r1(nn.functional.normalize(img_head(dvi), dim=-1),
                        nn.functional.normalize(cap_head(dvc), dim=-1), dv_c2i)
        tau = float(torch.as_tensor(loss_fn.temperature).detach())
        log.append((epoch + 1, loss.item(), r1, tau, time.perf_counter() - t0))
        print(f"epoch {epoch + 1}: loss {loss.item():.3f}  dev t2i R@1 {r1:.2f}  tau {tau:.4f}  "
              f"({time.perf_counter() - t0:.1f}s)", flush=True)
        if r1 > best:
            best, bad = r1, 0
            best_state = ({k: v.clone() for k, v in img_head.state_dict().items()},
                          {k: v.clone() for k, v in cap_head.state_dict().items()}, tau, epoch + 1)
        else:
            bad += 1
            if bad >= patience:
                break
    img_head.load_state_dict(best_state[0])
    cap_head.load_state_dict(best_state[1])
    return img_head, cap_head, best_state[2], best_state[3]


def evaluate_direction(queries, gallery, positives, train_bank, temperature, ks=(1, 5, 10), iters=4):
    from xmodal.retrieval.testtime import fit_normalizer
    from xmodal.metrics import normalization_error, retrieval

    q, g, bank = queries.numpy(), gallery.numpy(), train_bank.numpy()
    sim = queries @ gallery.T
    setups = [
        ("none", None, {}),
        ("DN", "dn", dict(bank=bank)),
        ("NCL Sinkhorn (train bank)", "sinkhorn", dict(bank=bank)),
        ("NCL Sinkhorn (oracle: dev queries)", "sinkhorn", dict(bank=None, oracle=True)),
        ("QB-Norm (train bank)", "qbnorm", dict(bank=bank)),
        ("IS (train bank)", "is", dict(bank=bank)),
        ("DSL (dev queries)", "dsl", dict(bank=None, oracle=True)),
    ]
    rows = []
    for label, method, kw in setups:
        if method is None:
            out, uses_test = sim, False
        else:
            norm = fit_normalizer(method, q, g, kw.get("bank"), oracle=kw.get("oracle", False),
                                  temperature=temperature, iters=iters)
            out, uses_test = norm(sim), norm.uses_test_queries
        m = retrieval(out, positives, ks=ks)
        m["norm_err"] = normalization_error(out, temperature)
        rows.append((label, uses_test, m))
    return rows


def print_table(title, rows, ks=(1, 5, 10)):
    print(f"\n### {title}\n")
    print("| normaliser | test queries? | " + " | ".join(f"R@{k}" for k in ks) + " | MdR | MnR | norm. error |")
    print("|---|---|" + "---:|" * (len(ks) + 3))
    for label, uses_test, m in rows:
        vals = " | ".join(f"{m[f'R@{k}']:.2f}" for k in ks)
        print(f"| {label} | {'yes' if uses_test else 'no'} | {vals} | {m['MdR']:.1f} | {m['MnR']:.1f} | "
              f"{m['norm_err']:.3f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sinkhorn-iters", type=int, default=4, help="NCL Sinkhorn iterations (NCL: 4)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.data):
        print(f"SKIP: Flickr8k data not found at {args.data}")
        return 0
    torch.manual_seed(args.seed)
    train_split, dev_split = load_split(args.data, "train"), load_split(args.data, "dev")
    mu_i, sd_i = train_split[0].mean(0), train_split[0].std(0) + 1e-6
    mu_c, sd_c = train_split[1].mean(0), train_split[1].std(0) + 1e-6
    std = lambda s: ((s[0] - mu_i) / sd_i, (s[1] - mu_c) / sd_c, s[2])  # noqa: E731
    train_split, dev_split = std(train_split), std(dev_split)
    img_head, cap_head, tau, epoch = train((train_split, dev_split), dim=args.dim, epochs=args.epochs,
                                           patience=args.patience, seed=args.seed, lr=args.lr,
                                           batch=args.batch)
    print(f"\nselected epoch {epoch} (dev t2i R@1), learned temperature {tau:.4f}")
    with torch.no_grad():
        enc = lambda head, x: nn.functional.normalize(head(torch.from_numpy(x)), dim=-1)  # noqa: E731
        dv_img, dv_cap = enc(img_head, dev_split[0]), enc(cap_head, dev_split[1])
        tr_img, tr_cap = enc(img_head, train_split[0]), enc(cap_head, train_split[1])
    c2i = dev_split[2]
    t2i = evaluate_direction(dv_cap, dv_img, c2i, tr_cap, tau, iters=args.sinkhorn_iters)
    i2t_pos = np.zeros((dv_img.shape[0], dv_cap.shape[0]), dtype=bool)
    i2t_pos[c2i, np.arange(len(c2i))] = True
    i2t = evaluate_direction(dv_img, dv_cap, i2t_pos, tr_img, tau, iters=args.sinkhorn_iters)
    print_table(f"Flickr8k dev, text-to-image ({dv_cap.shape[0]} captions -> {dv_img.shape[0]} images; "
                f"train bank {tr_cap.shape[0]} captions)", t2i)
    print_table(f"Flickr8k dev, image-to-text ({dv_img.shape[0]} images -> {dv_cap.shape[0]} captions, "
                f"all-captions; train bank {tr_img.shape[0]} images)", i2t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
