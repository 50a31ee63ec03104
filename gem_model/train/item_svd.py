"""Item embeddings started from the training window's co-occurrence structure (`train.item_svd`; off by default).

Why: the click gradient reaches an item's row only through the few clicks whose history holds it, and SGD
on in-batch co-occurrence losses moves the rows too slowly within one epoch (bench/MODEL_SEARCH.md), while
which items share histories, and which ads are shown beside which histories, is known from every row at once.
Before the first step: one bag per training row (its history items and its candidate, each once), the
positive PMI of how often two rows of the shared item table meet in a bag, and its leading `dim` singular
vectors (PPMI-SVD, Levy & Goldberg 2014) become the first `dim` coordinates of each seen row, at the table's
mean starting norm (the others 0; unseen rows keep their random start). With `model.topic_dim` the same
directions also go, frozen, into the `item_topic` buffer that the topic match statistics read.

A warm-started retrain (`init_from`) keeps the old rows and gives its window's ids without a direction (born
since, or past the old `max_rows` cap) one from a refit aligned with the old basis (`fold_in_item_svd`): the
window's PPMI-SVD, rotated onto the old directions of the ids both know (orthogonal Procrustes), gives each
new id its rotated vector, in the frozen buffer and, at the known rows' mean norm, in the table, as a cold
start would. The new ids' vectors then come from the same fit as the known ones they are compared with.
The LSI fold-in (the PPMI-weighted mean of the known co-occurring rows, `fold_in_rows`, kept for the
students) made the demo world's warm start worse than the old model on E-1 before any step (NE 0.984 ->
1.015; the aligned refit 0.982; bench/RESULTS.md).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from gem_model.data.batch import Batch
from gem_model.models.gem import GEM
from gem_model.models.layers import segment_ids

MAX_ROWS = 8192  # default cap on the rows fitted


def ppmi(counts: torch.Tensor) -> torch.Tensor:
    """max(0, log(C * total / (row sum * column sum))) of a symmetric count matrix; 0 where C is 0."""
    c = counts.float()
    total = c.sum()
    expected = c.sum(1, keepdim=True) * c.sum(0, keepdim=True)
    out = torch.log(c * total / expected.clamp_min(1e-300)).clamp_min(0.0)
    return torch.where(c > 0, out, torch.zeros_like(out))


def _item_weight(model: GEM, dim: int) -> torch.Tensor:
    """The weight of the item table shared by the candidate and the history, once `dim` is checked."""
    cfg = model.cfg
    if not cfg.target_pairs:
        raise ValueError("train.item_svd needs a history item column sharing a table with a candidate id")
    if not 1 <= dim <= cfg.d_model:
        raise ValueError(f"train.item_svd.dim must be in 1..d_model ({cfg.d_model}), not {dim}")
    if cfg.n_topic_stats and cfg.topic_dim != dim:
        raise ValueError(f"train.item_svd.dim ({dim}) must equal model.topic_dim ({cfg.topic_dim})")
    return model.tables[cfg.sparse_features[cfg.target_pairs[0][0]][1]].weight


@dataclass(frozen=True)
class Bags:
    """The bags of some rows (one per row: its history items and its candidate), as (bag, table row) pairs:
    what the fits read of the rows, kept so that several fits over overlapping days read each day once."""

    rows: torch.Tensor  # int32 [pairs]: the bag of each pair
    items: torch.Tensor  # int32 [pairs]: the table row of each pair
    n: int  # bags

    @staticmethod
    def empty() -> Bags:
        return Bags(torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 0)

    @staticmethod
    def read(model: GEM, batches: Iterable[Batch]) -> Bags:
        j, col = model.cfg.target_pairs[0]
        rows: list[torch.Tensor] = []
        items: list[torch.Tensor] = []
        n = 0
        for batch in batches:
            hist = batch.history[col].cpu()
            ads = batch.sparse[:, j].cpu()
            rows += [segment_ids(batch.offsets.long().cpu(), len(hist)) + n, torch.arange(len(ads)) + n]
            items += [hist, ads]
            n += len(ads)
        return Bags(torch.cat(rows).int(), torch.cat(items).int(), n) if rows else Bags.empty()

    @staticmethod
    def cat(parts: Iterable[Bags]) -> Bags:
        rows, items, n = [], [], 0
        for b in parts:
            rows.append(b.rows + n)
            items.append(b.items)
            n += b.n
        return Bags(torch.cat(rows), torch.cat(items), n) if rows else Bags.empty()


@dataclass(frozen=True)
class Cooc:
    """What a fit reads of some bags, uncapped: the table rows met (sorted), how often each was met (the cap's
    ranking), how many bags each pair of them shares, and the bags read. Counts of disjoint bags add up, so a
    fold over several days and the earlier hours of one day sums parts it counted before (a day served in
    slices) instead of counting every bag again; `capped` gives exactly what `bag_counts` gives of the bags
    pooled, provided no part was met on more than `max_rows` rows of its own (then its rows past the cap are
    left out of it: an approximation, never more memory than the cap's)."""

    seen: torch.Tensor  # int64 [n]
    occurrences: torch.Tensor  # int64 [n]: pairs of each row, a row met twice in a bag counted twice
    counts: torch.Tensor  # float32 [n, n], zero diagonal
    n: int  # bags

    @staticmethod
    def of(bags: Bags, max_rows: int = MAX_ROWS) -> Cooc:
        rows, items = bags.rows.long(), bags.items.long()
        keep = items != 0  # row 0: null / unknown id
        seen, compact = torch.unique(items[keep], return_inverse=True)
        occurrences = torch.bincount(compact, minlength=len(seen))
        rows, kept, compact = _top_rows(rows[keep], seen, compact, occurrences, max_rows)
        occurrences = occurrences[torch.isin(seen, kept)] if len(kept) < len(seen) else occurrences
        return Cooc(kept, occurrences, _pair_counts(rows, compact, len(kept), bags.n), bags.n)

    @staticmethod
    def sum(parts: Iterable[Cooc]) -> Cooc:
        parts = list(parts)
        seen = torch.unique(torch.cat([p.seen for p in parts])) if parts else torch.zeros(0, dtype=torch.long)
        occurrences = torch.zeros(len(seen), dtype=torch.long)
        counts = torch.zeros(len(seen), len(seen))
        for p in parts:
            at = torch.searchsorted(seen, p.seen)  # a part's rows are distinct: no index twice
            occurrences[at] += p.occurrences
            counts[at[:, None], at] += p.counts
        return Cooc(seen, occurrences, counts, sum(p.n for p in parts))

    def capped(self, max_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(seen, counts) of the `max_rows` rows met most often, as `bag_counts`."""
        if len(self.seen) <= max_rows:
            return self.seen, self.counts
        top = _most_met(self.occurrences, max_rows)
        return self.seen[top], self.counts[top][:, top]


def _most_met(occurrences: torch.Tensor, max_rows: int) -> torch.Tensor:
    """The sorted indices of the `max_rows` largest occurrences (the cap of `bag_counts`)."""
    return torch.topk(occurrences, max_rows).indices.sort().values


def _top_rows(rows: torch.Tensor, seen: torch.Tensor, compact: torch.Tensor, occurrences: torch.Tensor,
              max_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, seen, compact) of the pairs whose row is among the `max_rows` met most often."""
    if len(seen) <= max_rows:
        return rows, seen, compact
    top = _most_met(occurrences, max_rows)
    remap = torch.full((len(seen),), -1, dtype=torch.long)
    remap[top] = torch.arange(max_rows)
    compact = remap[compact]
    return rows[compact >= 0], seen[top], compact[compact >= 0]


def _pair_counts(rows: torch.Tensor, compact: torch.Tensor, n_seen: int, bags: int) -> torch.Tensor:
    """[n_seen, n_seen] bags shared by each pair of (compact) rows, zero diagonal; a row counts once per bag."""
    if n_seen == 0:
        return torch.zeros(0, 0)
    pairs = torch.unique(rows * n_seen + compact)  # each item once per bag
    h = torch.sparse_coo_tensor(torch.stack([pairs // n_seen, pairs % n_seen]), torch.ones(len(pairs)),
                                (bags, n_seen), is_coalesced=True, check_invariants=True)
    with warnings.catch_warnings():  # sparse x sparse goes through CSR, which torch calls beta
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        counts = torch.sparse.mm(h.t().coalesce(), h).to_dense()
    counts.fill_diagonal_(0.0)
    return counts


def _cooccurrence(model: GEM, batches: Iterable[Batch] | Bags | Cooc, max_rows: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`bag_counts` of the window's bags (one per training row: its history items and its candidate), and
    the bags read."""
    if isinstance(batches, Cooc):
        return *batches.capped(max_rows), batches.n
    bags = batches if isinstance(batches, Bags) else Bags.read(model, batches)
    if bags.n == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, 0), 0
    seen, counts = bag_counts(bags.rows.long(), bags.items.long(), bags.n, max_rows)
    return seen, counts, bags.n


def bag_counts(rows: torch.Tensor, items: torch.Tensor, bags: int, max_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(seen table rows [n], co-occurrence counts [n, n], zero diagonal) of bags given as (bag index,
    table row) pairs; row 0 (null / unknown) is left out, and only the `max_rows` rows met in the
    most bags are kept (the count matrix is dense)."""
    keep = items != 0  # row 0: null / unknown id
    rows, items = rows[keep], items[keep]
    if len(items) == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, 0)
    seen, compact = torch.unique(items, return_inverse=True)
    rows, seen, compact = _top_rows(rows, seen, compact, torch.bincount(compact, minlength=len(seen)), max_rows)
    return seen, _pair_counts(rows, compact, len(seen), bags)


@torch.no_grad()
def set_item_svd(model: GEM, batches: Iterable[Batch], dim: int, max_rows: int = MAX_ROWS) -> dict[str, int]:
    """The cold start of the module doc, from `batches` (the window, read once); the count matrix is dense
    (max_rows^2 floats). Returns {"rows": rows written, "bags": rows read}."""
    w = _item_weight(model, dim)
    seen, counts, bags = _cooccurrence(model, batches, max_rows)
    if len(seen) <= dim:
        return {"rows": 0, "bags": bags}
    u, s, _ = torch.svd_lowrank(ppmi(counts), q=min(dim + 8, len(seen)), niter=6)
    vec = torch.nn.functional.normalize(u[:, :dim] * s[:dim].sqrt(), dim=1)
    scale = w.norm(dim=1).mean()
    new = torch.zeros(len(seen), w.shape[1])
    new[:, :dim] = vec * scale.cpu()
    w[seen.to(w.device)] = new.to(w.dtype).to(w.device)
    if model.cfg.n_topic_stats:  # the frozen copy the topic statistics read (GEMConfig.topic_dim)
        model.item_topic.zero_()
        model.item_topic[seen.to(w.device)] = vec.to(model.item_topic.device)
    return {"rows": int(len(seen)), "bags": bags}


FOLD_PASSES = 3  # an id whose co-occurring ids are all new too gets its direction on a later pass


@torch.no_grad()
def fold_in_item_svd(model: GEM, batches: Iterable[Batch] | Bags | Cooc, dim: int, max_rows: int = MAX_ROWS,
                     known: torch.Tensor | None = None) -> dict[str, int]:
    """Give the window's ids without a direction one from the window's PPMI-SVD aligned with a warm-started
    model's basis (module doc); known rows, of the table and of `item_topic`, stay as they were. known: bool
    [table rows], the rows with a direction (default: a non-zero `item_topic` row; without that buffer pass
    it, or nothing is folded). Returns {"rows": given a direction, "known": known rows of the window,
    "unreached": new rows the fit leaves without one (no co-occurrence, or fewer known rows than `dim`
    to align on), "bags": read}."""
    w, cfg = _item_weight(model, dim), model.cfg
    if known is None:
        if not cfg.n_topic_stats:
            return {"rows": 0, "known": 0, "unreached": 0, "bags": 0}
        known = model.item_topic.norm(dim=1) > 0
    known = known.to("cpu").bool()
    seen, counts, bags = _cooccurrence(model, batches, max_rows)
    have = known[seen] if len(seen) else known[:0]
    n_known, n_new = int(have.sum()), int((~have).sum())
    if n_new == 0 or n_known < dim or len(seen) <= dim:
        return {"rows": 0, "known": n_known, "unreached": n_new, "bags": bags}
    u, s, _ = torch.svd_lowrank(ppmi(counts), q=min(dim + 8, len(seen)), niter=6)
    vec = torch.nn.functional.normalize(u[:, :dim] * s[:dim].sqrt(), dim=1)
    # the old directions of the known rows: the frozen buffer's, or the table's first `dim` coordinates
    old = (model.item_topic if cfg.n_topic_stats else w.detach()[:, :dim])[seen[have].to(w.device)].float().cpu()
    a, _, b = torch.linalg.svd(vec[have].T @ torch.nn.functional.normalize(old, dim=1))
    new_vec = vec[~have] @ (a @ b)  # the rotation that best carries the refit onto the old basis
    reached = new_vec.norm(dim=1) > 1e-6  # an id with no co-occurrence gets no direction from the fit
    rows = seen[~have][reached].to(w.device)
    topic = torch.nn.functional.normalize(new_vec[reached], dim=1)
    scale = w.detach()[seen[have].to(w.device)].norm(dim=1).mean().cpu()
    table = torch.zeros(len(rows), w.shape[1])
    table[:, :dim] = topic * scale
    w[rows] = table.to(w.dtype).to(w.device)
    if cfg.n_topic_stats:
        model.item_topic[rows] = topic.to(model.item_topic.dtype).to(model.item_topic.device)
    return {"rows": int(reached.sum()), "known": n_known, "unreached": int((~reached).sum()), "bags": bags}


def fold_in_rows(p: torch.Tensor, have: torch.Tensor, vectors: list[tuple[torch.Tensor, float]]) -> torch.Tensor:
    """LSI-style folding-in over `FOLD_PASSES` passes: each row without a direction (~have) that
    co-occurs (PPMI `p` [n, n] > 0) with rows that have one gets, in every tensor of `vectors`
    ([n, d] each, changed in place), the PPMI-weighted mean of those rows, renormalised to the given
    norm. Rows folded on a pass count as known on the next. Returns the bool [n] of rows folded."""
    have = have.clone()
    folded = torch.zeros(len(have), dtype=torch.bool)
    for _ in range(FOLD_PASSES):
        todo = (~have).nonzero().flatten()
        if len(todo) == 0:
            break
        weights = p[todo][:, have]  # PPMI of each new row with each row that has a direction
        reach = weights.sum(1) > 0
        if not reach.any():
            break
        todo, weights = todo[reach], weights[reach]
        for vec, norm in vectors:
            vec[todo] = torch.nn.functional.normalize(weights @ vec[have], dim=1) * norm
        have[todo] = True
        folded[todo] = True
    return folded


@torch.no_grad()
def set_topic_stat_mean(model: GEM, batches: Iterable[Batch], max_batches: int = 16) -> int:
    """`model.topic_log_share`: the mean of each topic statistic over the rows of `batches` (the window's first
    `max_batches`) whose candidate has a topic vector, written to `topic_stat_mean` (what a candidate without
    one reads). Returns the rows averaged."""
    j, _ = model.cfg.target_pairs[0]
    total, n = torch.zeros(model.cfg.n_topic_stats, dtype=torch.float64), 0
    for batch in itertools.islice(batches, max_batches):
        batch = batch.to(model.item_topic.device)
        seg = segment_ids(batch.offsets, len(batch.history[model.cfg.target_pairs[0][1]]))
        placed = model.has_topic(batch.sparse[:, j])
        total += model.topic_stats(batch, seg, len(batch))[placed].double().sum(0).cpu()
        n += int(placed.sum())
    model.topic_stat_mean.copy_((total / max(n, 1)).to(model.topic_stat_mean.dtype))
    return n


def start_item_table(model: GEM, batches: Iterable[Batch], dim: int, max_rows: int = MAX_ROWS, *,
                     warm: bool = False) -> dict[str, int]:
    """The training start-up's entry: a cold start fits the window's PPMI-SVD (`set_item_svd`), a
    warm start (weights from an older checkpoint) folds the window's new ids into it (`fold_in_item_svd`),
    unless the old model has no topic directions at all (trained without item_svd): then it is fitted."""
    if warm and model.cfg.n_topic_stats and not bool(model.item_topic.any()):
        warm = False  # the old model never had an SVD start: there is no basis to fold into, fit one
    if warm:
        return {"warm": 1, **fold_in_item_svd(model, batches, dim, max_rows)}
    return set_item_svd(model, batches, dim, max_rows)
