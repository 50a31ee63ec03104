"""Per-id wide offsets fitted from counts before training (`train.wide_prior`; off by default).

Why: on rating data (Douban) the strongest signal is each user's and each item's own positive rate, and one
pass of row-wise Adagrad moves a rarely seen row by about `wide_lr` per sighting whatever the evidence (its
first step is a sign step): the offsets stay far from the logistic regression's optimum, and a second pass
overfits the deep id embeddings (E-1, bench/MODEL_SEARCH.md). So the listed features' offsets start at an
L2-regularised logistic regression on the window, by block coordinate Newton steps (backfitting): in each of
`passes` sweeps, feature by feature,

    w[id, task] += (sum over the id's rows (y - p) - l2 w) / (sum over them p (1 - p) + l2),
    p = sigmoid(b + the offsets of every listed feature as they stand)

One pass leaves the users' offsets blind to their items' (a user of popular items looks generous); repeated
sweeps converge to the joint fit. b is the head bias plus the wide path over the dense inputs (zero unless
`set_dense_prior` fitted it first), never the whole model's starting logit: fitted against that, the offsets
absorb its noise in-sample and Douban's E-1 after training is worse (bench/MODEL_SEARCH.md 7). The window is
read once; only the labelled rows' (surface, labels, mask, ids, dense inputs) stay in memory.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gem_model.data.batch import TASKS, Batch
from gem_model.models.gem import GEM


@torch.no_grad()
def set_wide_prior(model: GEM, batches: Iterable[Batch], features: list[str], l2: float,
                   max_abs: float = 3.0, passes: int = 1) -> dict[str, int]:
    """Write the offsets of `features` (sparse feature names) into model.wide_tables from `batches`
    (the training window, read once). Returns {feature: ids with at least one labelled row}."""
    cfg = model.cfg
    names = [n for n, _ in cfg.sparse_features]
    if unknown := sorted(set(features) - set(names)):
        raise ValueError(f"train.wide_prior.features: {unknown} are not sparse features ({names})")
    if l2 <= 0:
        raise ValueError("train.wide_prior.l2 must be > 0")
    if passes < 1:
        raise ValueError("train.wide_prior.passes must be >= 1")
    cols = [(names.index(f), cfg.sparse_features[names.index(f)][1]) for f in features]
    if len({t for _, t in cols}) < len(cols):
        raise ValueError(f"train.wide_prior.features: {features} share a wide table (one would overwrite the other)")
    heads = torch.stack([model.head_b[s] for s in cfg.surfaces]).detach().double().cpu()  # [n_surfaces, n_tasks]
    rows = _labelled_rows(model, batches, [j for j, _ in cols])
    if rows is None:
        return {f: 0 for f in features}
    surface, y, mask, dense, sparse = rows
    m = mask.double()
    b = heads[surface] + _dense_term(model, dense, surface)  # 0 unless a dense prior set it
    ids = {f: sparse[:, k] for k, f in enumerate(features)}
    w = {f: torch.zeros(cfg.tables[t], b.shape[1], dtype=torch.float64) for f, (_, t) in zip(features, cols, strict=True)}
    curv: dict[str, torch.Tensor] = {}
    for _ in range(passes):
        for f in features:
            z = b + sum(w[g][ids[g]] for g in features)
            p = torch.sigmoid(z)
            grad = torch.zeros_like(w[f]).index_add_(0, ids[f], (y - p) * m) - l2 * w[f]
            curv[f] = torch.zeros_like(w[f]).index_add_(0, ids[f], p * (1 - p) * m)
            w[f] = (w[f] + grad / (curv[f] + l2)).clamp(-max_abs, max_abs)
    for f, (_, table) in zip(features, cols, strict=True):
        model.wide_tables[table].weight.copy_(w[f])  # copy_ casts float64 to the table's dtype and device
    return {f: int((curv[f].sum(1) > 0).sum()) for f in features}


def _labelled_rows(
    model: GEM, batches: Iterable[Batch], sparse_cols: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(surface, labels, mask of the heads' allowed labels, dense, the listed sparse columns) of every
    row with at least one label, read once on the CPU; None if there is none."""
    allowed = model.task_allowed.cpu()
    parts: list[list[torch.Tensor]] = [[], [], [], [], []]
    for batch in batches:
        s = batch.surface_idx.long().cpu()
        m = batch.label_mask.cpu() & allowed[s]
        keep = m.any(1)
        for part, value in zip(parts, (s, batch.labels.cpu().double(), m, batch.dense.cpu(),
                                       batch.sparse[:, sparse_cols].long().cpu()), strict=True):
            part.append(value[keep])
    if not parts[0]:
        return None
    return tuple(torch.cat(p) for p in parts)  # type: ignore[return-value]


def _standardised(model: GEM, dense: torch.Tensor) -> torch.Tensor:
    """The dense inputs as forward standardises them (float64)."""
    return (dense.double() - model.dense_mean.double().cpu()) / model.dense_std.double().cpu()


def _dense_term(model: GEM, dense: torch.Tensor, surface: torch.Tensor) -> torch.Tensor:
    """[rows, tasks] the heads' wide path over the dense inputs alone."""
    x = _standardised(model, dense)
    w = torch.stack([model.wide[s][:, : x.shape[1]] for s in model.cfg.surfaces]).detach().double().cpu()
    return torch.einsum("rk,rtk->rt", x, w[surface])


@torch.no_grad()
def set_dense_prior(model: GEM, batches: Iterable[Batch], features: list[str], l2: float = 1.0,
                    iters: int = 8, pool_l2: float | None = None) -> dict[str, int]:
    """Fit, per (surface, task) head, an L2 logistic regression (Newton steps) of the label on the listed
    dense features (standardised) and an intercept on the window (`train.dense_prior`); the head's bias and
    wide path start there (0 on every other wide input: the match statistics would move the start off the
    fit). Meant for counters (gem_pipelines/data/counters.py): from earlier days, they are not in-sample,
    while trained from zero the ids learn the window's rows first (bench/MODEL_SEARCH.md 8).

    pool_l2: the heads of one task are fitted jointly, each surface's weights = weights shared by every
    surface + its own difference, L2 `l2` on the shared and `pool_l2` on the differences (intercepts
    free): a surface with few clicks borrows the others' fit instead of shrinking toward 0, which a
    single-surface model cannot do (bench/MODEL_SEARCH.md 14). None: each head alone.
    Returns {surface: labelled click rows}."""
    names = model.cfg.dense_features
    if unknown := sorted(set(features) - set(names)):
        raise ValueError(f"train.dense_prior: {unknown} are not dense features ({names})")
    if pool_l2 is not None and pool_l2 <= 0:
        raise ValueError("train.dense_prior.pool_l2 must be > 0 (or unset)")
    cols = [names.index(f) for f in features]
    labelled = _labelled_rows(model, batches, [])
    if labelled is None:
        return {}
    surface, y, m, dense, _ = labelled
    x = _standardised(model, dense)[:, cols]
    rows = {}
    for t in range(len(TASKS)):
        present = [k for k in range(len(model.cfg.surfaces)) if bool((m[:, t] & (surface == k)).any())]
        groups = [present] if pool_l2 is not None and len(present) > 1 else [[k] for k in present]
        for group in groups:
            sel = m[:, t] & torch.isin(surface, torch.tensor(group))
            local = torch.searchsorted(torch.tensor(group), surface[sel])  # surface -> 0..len(group)-1
            intercepts, slopes = _fit_heads(local, len(group), x[sel], y[sel, t], l2, pool_l2, iters)
            for i, k in enumerate(group):
                name = model.cfg.surfaces[k]
                model.head_b[name][t] = float(intercepts[i])
                model.wide[name][t] = 0.0  # the head's whole wide path starts at the fit (match statistics off)
                for c, j in enumerate(cols):
                    model.wide[name][t, j] = float(slopes[i, c])
                if TASKS[t] == "click":
                    rows[name] = int((local == i).sum())
    return rows


def _fit_heads(group: torch.Tensor, n: int, x: torch.Tensor, y: torch.Tensor, l2: float, pool_l2: float | None,
               iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Newton steps of the penalised log loss over (an intercept per head, shared slopes, each head's
    difference); without pooling or with one head the difference is absent. -> intercepts [n], slopes [n, k]."""
    k, pooled = x.shape[1], pool_l2 is not None and n > 1
    onehot = torch.nn.functional.one_hot(group, n).double()
    parts, pen = [onehot, x], [0.0] * n + [l2] * k  # no penalty on the intercepts
    if pooled:
        parts.append((onehot[:, :, None] * x[:, None, :]).reshape(len(x), n * k))
        pen += [pool_l2] * (n * k)
    design, penalty = torch.cat(parts, dim=1), torch.diag(torch.tensor(pen, dtype=torch.float64))
    theta = torch.zeros(design.shape[1], dtype=torch.float64)
    rate = ((onehot * y[:, None]).sum(0) / onehot.sum(0)).clamp(1e-4, 1 - 1e-4)
    theta[:n] = torch.log(rate / (1 - rate))
    for _ in range(iters):
        p = torch.sigmoid(design @ theta)
        grad = design.T @ (y - p) - penalty @ theta
        hess = (design * (p * (1 - p))[:, None]).T @ design + penalty + 1e-9 * torch.eye(len(theta), dtype=torch.float64)
        theta += torch.linalg.solve(hess, grad)
    slopes = theta[n : n + k].expand(n, k).clone()
    if pooled:
        slopes += theta[n + k :].reshape(n, k)
    return theta[:n], slopes
