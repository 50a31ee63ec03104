"""Neighbour counters: how users like the row's user rated the row's ad on earlier days (user-based
collaborative filtering, point in time, opt-in: `counters.neighbours` in features.yaml).

Every earlier impression (clicks counted once arrived by the row's midnight, as in data/counters.py)
becomes the user's rating of the ad relative to the user's own rate on that surface (a generous user's
click says less). Two users' likeness is the cosine of those ratings, over every surface
(`ad_neighbours_click_before`) or over the row's surface alone (`ad_neighbours_own_click_before`, what
a single-surface model may read). A row reads the likeness-weighted mean of the ad's earlier ratings by
other users, shrunk by one neighbour of likeness 1 who rated it as usual: sum(sim * r) / (sum|sim| + 1).
On every surface, a user's ratings of books say who else shares their taste in films: the item ids
of two surfaces never meet, the users do.
"""

from __future__ import annotations

import warnings

import polars as pl
import torch

NEIGHBOUR_COLUMNS = ("ad_neighbours_click_before", "ad_neighbours_own_click_before")


def _likeness(u: torch.Tensor, i: torch.Tensor, r: torch.Tensor, n_users: int, n_items: int) -> torch.Tensor:
    """[n_users, n_users] cosine of the users' rating vectors (rows of a sparse user x item matrix)."""
    x = torch.sparse_coo_tensor(torch.stack([u, i]), r, (n_users, n_items), check_invariants=True).coalesce()
    norm = torch.zeros(n_users, dtype=r.dtype).index_add_(0, u, r * r).sqrt().clamp_min(1e-12)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the product is made dense at once
        warnings.simplefilter("ignore", UserWarning)
        dots = torch.sparse.mm(x, x.t()).to_dense()
    return dots / norm[:, None] / norm[None, :]


def attach_neighbours(day: pl.DataFrame, known: pl.DataFrame) -> pl.DataFrame:
    """`day` (surface, ad_id, user_id, ...) + NEIGHBOUR_COLUMNS from `known` (surface, ad_id, user_id,
    clicked as 0/1 floats) of earlier days; 0 where the ad has no earlier rating by a user with a likeness."""
    ratings = (
        known.with_columns(r=pl.col("clicked") - pl.col("clicked").mean().over("surface", "user_id"))
        .group_by("surface", "ad_id", "user_id").agg(pl.col("r").mean())
    )
    users = pl.concat([ratings["user_id"], day["user_id"]]).unique().to_frame().with_row_index("u")
    items = ratings.select("surface", "ad_id").unique().with_row_index("i")
    rated = ratings.join(users, on="user_id").join(items, on=["surface", "ad_id"])
    surfaces = sorted(set(rated["surface"]))
    n_u, n_i = users.height, items.height

    def tensor(df: pl.DataFrame, col: str) -> torch.Tensor:
        return torch.from_numpy(df[col].to_numpy().astype("int64" if col != "r" else "float64"))

    sim_all = _likeness(tensor(rated, "u"), tensor(rated, "i"), tensor(rated, "r"), n_u, n_i)
    sim_own = {}
    for s in surfaces:
        part = rated.filter(pl.col("surface") == s)
        sim_own[s] = _likeness(tensor(part, "u"), tensor(part, "i"), tensor(part, "r"), n_u, n_i)

    rows = day.select("surface", "ad_id", "user_id").with_row_index("row").join(users, on="user_id")
    pairs = rows.join(rated.select("surface", "ad_id", v="u", r="r", v_user="user_id"), on=["surface", "ad_id"]).filter(
        pl.col("v_user") != pl.col("user_id"))
    out = {c: torch.zeros(day.height, dtype=torch.float64) for c in NEIGHBOUR_COLUMNS}
    if pairs.height:
        row, u, v, r = (tensor(pairs, c) for c in ("row", "u", "v", "r"))
        own = torch.zeros(pairs.height, dtype=torch.float64)
        for s in surfaces:
            m = torch.from_numpy((pairs["surface"] == s).to_numpy())
            own[m] = sim_own[s][u[m], v[m]]
        for col, sim in zip(NEIGHBOUR_COLUMNS, (sim_all[u, v], own), strict=True):
            num = torch.zeros(day.height, dtype=torch.float64).index_add_(0, row, sim * r)
            den = torch.zeros(day.height, dtype=torch.float64).index_add_(0, row, sim.abs())
            out[col] = num / (den + 1.0)
    return day.with_columns(**{c: pl.Series(c, out[c].numpy()) for c in NEIGHBOUR_COLUMNS})
