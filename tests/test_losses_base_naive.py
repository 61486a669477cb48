"""(No tests here.) Independent naive loss implementations: explicit Python loops over the batch, written
from the papers' equations (no masking tricks, no logsumexp). Each returns a 0-d tensor
built from scalar autograd ops, so gradients can be compared as well."""

from __future__ import annotations

import torch


def _norm(x):
    rows = []
    for i in range(x.shape[0]):
        s = torch.zeros((), dtype=x.dtype)
        for d in range(x.shape[1]):
            s = s + x[i, d] * x[i, d]
        rows.append(x[i] / torch.sqrt(s))
    return torch.stack(rows)


def _dot(a, b):
    s = torch.zeros((), dtype=a.dtype)
    for d in range(a.shape[0]):
        s = s + a[d] * b[d]
    return s


def _taus(tau, n):
    if isinstance(tau, torch.Tensor):
        return [tau[i] for i in range(n)]
    return [tau] * n


def _same(ids, i, j):
    return ids is not None and int(ids[i]) == int(ids[j])


def infonce(v, t, tau_t2v, tau_v2t=None, ids=None, normalize=True):
    """CLIP: L = (L_t2v + L_v2t)/2; other same-id items leave the denominator."""
    if tau_v2t is None:
        tau_v2t = tau_t2v
    if normalize:
        v, t = _norm(v), _norm(t)
    n = v.shape[0]
    a, b = _taus(tau_t2v, n), _taus(tau_v2t, n)
    total_t2v = 0.0
    total_v2t = 0.0
    for i in range(n):
        num = torch.exp(_dot(t[i], v[i]) / a[i])
        den = 0.0
        for k in range(n):
            if k == i or not _same(ids, i, k):
                den = den + torch.exp(_dot(t[i], v[k]) / a[i])
        total_t2v = total_t2v - torch.log(num / den)
        num = torch.exp(_dot(v[i], t[i]) / b[i])
        den = 0.0
        for k in range(n):
            if k == i or not _same(ids, i, k):
                den = den + torch.exp(_dot(v[i], t[k]) / b[i])
        total_v2t = total_v2t - torch.log(num / den)
    return (total_t2v / n + total_v2t / n) / 2


def ntxent(v, t, tau_t2v, tau_v2t=None, ids=None):
    """SimCLR eq. 1 over the 2B views z = [v; t]."""
    if tau_v2t is None:
        tau_v2t = tau_t2v
    v, t = _norm(v), _norm(t)
    n = v.shape[0]
    z = [v[i] for i in range(n)] + [t[i] for i in range(n)]
    taus = _taus(tau_v2t, n) + _taus(tau_t2v, n)
    ids2 = None if ids is None else list(ids.tolist()) * 2
    total = 0.0
    for a in range(2 * n):
        p = (a + n) % (2 * n)
        num = torch.exp(_dot(z[a], z[p]) / taus[a])
        den = 0.0
        for k in range(2 * n):
            if k == a:
                continue
            if k != p and ids2 is not None and ids2[k] == ids2[a]:
                continue
            den = den + torch.exp(_dot(z[a], z[k]) / taus[a])
        total = total - torch.log(num / den)
    return total / (2 * n)


def maxmargin(v, t, margin, ids=None, hardest=False, summed=False):
    """(1/B) sum_i mean_{j in N_i} max(0, s_ij - s_ii + m_i) per direction, averaged
    (``summed``: sum over N_i, TS++ eq. 3.3)."""
    v, t = _norm(v), _norm(t)
    n = v.shape[0]
    m = _taus(margin, n)
    out = []
    for q, g in ((v, t), (t, v)):
        total = 0.0
        for i in range(n):
            hinges = []
            for j in range(n):
                if j == i or _same(ids, i, j):
                    continue
                hinges.append(torch.clamp(_dot(q[i], g[j]) - _dot(q[i], g[i]) + m[i], min=0.0))
            if hinges:
                if hardest:
                    total = total + max(hinges)
                else:
                    total = total + sum(hinges) / (1 if summed else len(hinges))
        out.append(total / n)
    return (out[0] + out[1]) / 2


def mimaxmargin(v, t, rel, margin, threshold):
    """Per anchor: mean over (positive, negative) pairs of max(0, m + s_an - s_ap)."""
    v, t = _norm(v), _norm(t)
    n = v.shape[0]
    m = _taus(margin, n)
    out = []
    for q, g, r in ((v, t, rel), (t, v, rel.t())):
        total = 0.0
        for i in range(n):
            terms = []
            for p in range(n):
                if float(r[i, p]) < threshold:
                    continue
                for k in range(n):
                    if float(r[i, k]) >= threshold:
                        continue
                    terms.append(torch.clamp(m[i] + _dot(q[i], g[k]) - _dot(q[i], g[p]), min=0.0))
            if terms:
                total = total + sum(terms) / len(terms)
        out.append(total / n)
    return (out[0] + out[1]) / 2


def milnce(v, t, tau, ids):
    """Miech et al. eq. 1 per direction: positives = same id, negatives = the rest."""
    v, t = _norm(v), _norm(t)
    n = v.shape[0]
    taus = _taus(tau, n)
    out = []
    for q, g in ((t, v), (v, t)):
        total = 0.0
        for i in range(n):
            pos = 0.0
            neg = 0.0
            for k in range(n):
                e = torch.exp(_dot(q[i], g[k]) / taus[i])
                if k == i or _same(ids, i, k):
                    pos = pos + e
                else:
                    neg = neg + e
            total = total - torch.log(pos / (pos + neg))
        out.append(total / n)
    return (out[0] + out[1]) / 2


def dcl(v, t, tau, tau_plus, ids=None):
    """Chuang et al. 2020 with the official clamp, cross-modal, symmetric."""
    v, t = _norm(v), _norm(t)
    n = v.shape[0]
    taus = _taus(tau, n)
    out = []
    for q, g in ((t, v), (v, t)):
        total = 0.0
        for i in range(n):
            pos = torch.exp(_dot(q[i], g[i]) / taus[i])
            neg = 0.0
            count = 0
            for k in range(n):
                if k == i or _same(ids, i, k):
                    continue
                neg = neg + torch.exp(_dot(q[i], g[k]) / taus[i])
                count += 1
            ng = (-tau_plus * count * pos + neg) / (1 - tau_plus)
            floor = count * torch.exp(-1.0 / torch.as_tensor(taus[i], dtype=v.dtype))
            ng = torch.maximum(ng, floor)
            total = total - torch.log(pos / (pos + ng))
        out.append(total / n)
    return (out[0] + out[1]) / 2


def milnce_official(video, text_groups, tau):
    """The HowTo100M MIL-NCE code's formula, as loops: video i, its K captions
    text_groups[i]; denominator = video i vs every caption, plus every video vs the
    captions of i."""
    n = len(video)
    total = 0.0
    for i in range(n):
        num = 0.0
        for c in text_groups[i]:
            num = num + torch.exp(_dot(video[i], c) / tau)
        den = 0.0
        for j in range(n):
            for c in text_groups[j]:
                den = den + torch.exp(_dot(video[i], c) / tau)
        for j in range(n):
            for c in text_groups[i]:
                den = den + torch.exp(_dot(video[j], c) / tau)
        total = total - torch.log(num / den)
    return total / n
