"""In-memory, fixed-shape student inputs built from `training_examples` (through gem_model.data.loader's
ExampleStream) and joined by request_id with the `teacher_predictions` table.

Students read no jagged tensors: only the last `hist_k` history item ids per row (most recent
first, 0 = padding), so a surface's student window fits in memory as plain tensors and is read
from Delta once, not once per epoch.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import polars as pl
import torch

from gem_model.config import SurfacesConfig, load_features, load_surfaces
from gem_model.data.loader import Batch, ExampleStream

CHUNK_ROWS = 65536


def last_k(offsets: torch.Tensor, values: torch.Tensor, k: int) -> torch.Tensor:
    """The last k values of each jagged row, most recent first, zero-padded: [B, k]."""
    offsets = offsets.long()
    b = offsets.numel() - 1
    if k <= 0 or values.numel() == 0:
        return torch.zeros(b, max(k, 0), dtype=torch.long)
    lengths = offsets[1:] - offsets[:-1]
    j = torch.arange(k)
    pos = (offsets[1:, None] - 1 - j).clamp_min(0)
    valid = lengths[:, None] > j
    return torch.where(valid, values.long()[pos.clamp_max(values.numel() - 1)], torch.zeros((), dtype=torch.long))


@dataclass
class StudentData:
    dense: torch.Tensor  # [N, m] float32
    sparse: torch.Tensor  # [N, n] int64
    hist_ids: torch.Tensor  # [N, k] int64, most recent first, 0 = padding
    surface_idx: torch.Tensor  # [N]
    labels: torch.Tensor  # [N, 2] float32
    label_mask: torch.Tensor  # [N, 2] bool
    request_ids: np.ndarray  # [N] object (str)
    dates: np.ndarray  # [N] datetime64[D]
    teacher_p: torch.Tensor | None = None  # [N, 2] float32, NaN where the teacher has no prediction
    teacher_emb: torch.Tensor | None = None  # [N, E] float32
    teacher: str | None = None

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def take(self, idx: np.ndarray | torch.Tensor) -> StudentData:
        idx_t = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        idx_n = idx_t.numpy()
        return replace(self, **{f.name: v[idx_t if isinstance(v, torch.Tensor) else idx_n] for f in fields(self)
                                if isinstance(v := getattr(self, f.name), torch.Tensor | np.ndarray)})

    def to(self, device: torch.device | str) -> StudentData:
        """The tensors moved to `device` (request ids and dates stay numpy)."""
        return replace(self, **{f.name: v.to(device) for f in fields(self)
                                if isinstance(v := getattr(self, f.name), torch.Tensor)})

    def on_dates(self, dates: Sequence[dt.date]) -> StudentData:
        want = np.array([np.datetime64(d, "D") for d in dates])
        return self.take(np.flatnonzero(np.isin(self.dates, want)))

    def for_surface(self, surface_idx: int) -> StudentData:
        return self.take(np.flatnonzero((self.surface_idx == surface_idx).numpy()))

    @property
    def date_set(self) -> list[dt.date]:
        return sorted({d.astype("datetime64[D]").astype(dt.date) for d in np.unique(self.dates)})

    @staticmethod
    def concat(parts: Sequence[StudentData]) -> StudentData:
        kw = {}
        for f in fields(StudentData):
            vs = [getattr(p, f.name) for p in parts]
            kw[f.name] = (torch.cat(vs) if isinstance(vs[0], torch.Tensor)
                          else np.concatenate(vs) if isinstance(vs[0], np.ndarray) else vs[0])
        return StudentData(**kw)


def load_examples(dates: Sequence[dt.date | str], surfaces: Sequence[str] | None = None, *, hist_k: int = 16,
                  uri: str | None = None, surfaces_config: SurfacesConfig | None = None) -> StudentData:
    """Every row of `training_examples` on `dates` for `surfaces`, in table order, as fixed-shape
    student tensors. One read, through ExampleStream."""
    features = load_features()
    surfaces_config = surfaces_config or load_surfaces()
    hist_col = next(c.name for c in features.history.columns if c.source == "item_id")
    parts: list[StudentData] = []
    for d in dates:
        d = d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d))
        stream = ExampleStream(d, d, surfaces, batch_size=CHUNK_ROWS, features=features, surfaces_config=surfaces_config,
                               uri=uri, shuffle=False, drop_last=False, chunk_rows=CHUNK_ROWS,
                               shuffle_buffer=CHUNK_ROWS, max_len=max(hist_k, 1))
        parts += [_from_batch(b, d, hist_col, hist_k) for b in stream]
    if not parts:
        raise ValueError(f"training_examples has no rows on {[str(d) for d in dates]} for surfaces {surfaces}")
    return StudentData.concat(parts)


def _from_batch(b: Batch, day: dt.date, hist_col: str, hist_k: int) -> StudentData:
    return StudentData(dense=b.dense.float(), sparse=b.sparse.long(), hist_ids=last_k(b.offsets, b.history[hist_col], hist_k),
                       surface_idx=b.surface_idx.long(), labels=b.labels.float(), label_mask=b.label_mask.bool(),
                       request_ids=np.asarray(b.request_ids, dtype=object), dates=np.full(len(b), np.datetime64(day, "D")))


def attach_teacher(
    data: StudentData, predictions: pl.DataFrame, teacher: str, *, embeddings: bool = True
) -> StudentData:
    """Join the `teacher` rows of a teacher_predictions frame onto `data` by request_id (row order
    of `data` is kept whatever the order of `predictions`); every row must have a prediction."""
    tp = predictions.filter(pl.col("teacher") == teacher)
    cols = ["request_id", "p_click", "p_conversion"] + (["embedding"] if embeddings else [])
    tp = tp.select(cols).unique("request_id", keep="first")
    left = pl.DataFrame({"request_id": pl.Series(data.request_ids.tolist(), dtype=pl.String)})
    joined = left.join(tp, on="request_id", how="left", maintain_order="left")
    missing = joined["p_click"].is_null() & ~joined["request_id"].is_in(tp["request_id"].implode())
    if n_missing := int(missing.sum()):
        ex = joined.filter(missing)["request_id"].head(3).to_list()
        raise KeyError(f"teacher {teacher!r}: {n_missing} of {len(data)} rows have no prediction (e.g. {ex})")
    p = np.ascontiguousarray(joined.select(pl.col("p_click", "p_conversion").cast(pl.Float32).fill_null(np.nan)).to_numpy())
    emb = None
    if embeddings:
        e = joined["embedding"]
        if dim := int(e.drop_nulls().list.len().max() or 0):
            arr = e.fill_null([0.0] * dim).list.to_array(dim).to_numpy().astype(np.float32)
            emb = torch.from_numpy(np.ascontiguousarray(arr))
    return replace(data, teacher_p=torch.from_numpy(p), teacher_emb=emb, teacher=teacher)
