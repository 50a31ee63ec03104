"""GEMConfig: the model's arguments as plain data (checkpoints carry `to_dict()`, never the dataclass)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # gem_model.config needs pydantic: imported lazily, so the model runs without it
    from gem_model.config import FeaturesConfig, SurfacesConfig

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
# each target pair's match statistics, in the order gem_model.models.target_attention computes them ("same":
# only with `exact_match`)
MATCH_STATS = ("count_log", "count_share", "mean", "max", "raw_mean", "same")
# options removed with their code, at their "off" value (None: any value was inert): older checkpoints
# that carry them at that value still load
RETIRED: dict[str, Any] = {"cooc_weight": 0.0, "cooc_pairs": None, "cooc_temperature": None, "cooc_clicks": False,
                           "exposure_weight": 0.0, "exposure_temperature": None,
                           "history_click_share": False, "click_action_row": None,
                           "shared_wide": False}


# filled by `GEMConfig.from_specs` from features.yaml and surfaces.yaml: never a preset's model key
SPEC_FIELDS = frozenset({"dense_features", "sparse_features", "history_columns", "tables", "surfaces", "surface_tasks",
                         "hist_max_len"})


@dataclass
class GEMConfig:
    # -- trunk dimensions -----------------------------------------------------------------------
    d_model: int = 32  # width of every token (embedding dim of every table)
    n_blocks: int = 2  # InterFormer blocks
    n_heads: int = 2  # attention heads; d_model / n_heads must be in {16, 32, 64, 128}
    wukong_layers: int = 1  # Wukong layers in each interaction arch
    wukong_k: int = 8  # columns of the learnable projection Y [n, k] in the FMB
    wukong_hidden: int = 128  # FMB MLP width
    wukong_fm_frac: float = 0.5  # n_F = round(frac * n_tokens), n_L = n_tokens - n_F
    n_sum: int = 4  # X_sum tokens (gated linear compression of the non-sequence tokens)
    n_cls: int = 2  # CLS tokens prepended to every sequence (>= 1: keeps empty histories defined)
    n_pma: int = 2  # PMA seed tokens (pooling by multi-head attention)
    n_recent: int = 4  # most recent sequence tokens copied into S_sum
    ffn_mult: int = 2  # personalised-FFN expansion
    time_buckets: int = 32  # log2 buckets of seconds_before for the time-gap encoding
    summary_dim: int = 64  # the pooled representation the heads (and distillation) read
    head_hidden: int = 128  # width of the MLP that produces the summary
    dropout: float = 0.0
    # a deep head shared by every surface beside each surface's own (added, STAR-style): a surface with few clicks
    # reads what the others taught the head, not only its own few gradients
    shared_head: bool = False
    emb_dropout: float = 0.0  # dropout on embedding tokens (memorisation lives in the id tables)
    target_attention: bool = True  # DIN-style candidate-vs-history tokens for tables shared with history
    ta_hidden: int = 32  # width of the DIN activation unit
    exact_match: bool = True  # the count of the candidate's own id in the history is a match statistic
    # rows of the wide history-item x candidate cross table (0: none): the logistic regression's
    # strongest features, inside the model's wide path (hashed pairs, 1/sqrt(history length) each)
    wide_cross_rows: int = 0
    # width of a frozen per-item topic vector of the shared item table (0: none; `train.item_svd` writes it, a
    # buffer): mean and max cos(candidate, item) over the history keep the window's co-occurrence structure
    # whatever the click gradient does to the trained embeddings
    topic_dim: int = 0
    # a third topic statistic, log((sum of max(cos, 0) + 0.5) / (length + 1)): the interest enters the click
    # logit as the log of the topic's share of the history, which the mean cos (the share) reads linearly
    topic_log_share: bool = False
    attention: str = "jagged"  # jagged (kernels.jagged_attention) | padded (SDPA over a padded batch)
    max_hist_len: int | None = None  # None: features.yaml history.max_len (never longer)

    # -- from the specs (filled by `from_specs`; carried in checkpoints) -------------------------
    dense_features: list[str] = field(default_factory=list)
    sparse_features: list[list[str]] = field(default_factory=list)  # [name, table]
    history_columns: list[list[str]] = field(default_factory=list)  # [name, source, table or ""]
    tables: dict[str, int] = field(default_factory=dict)  # table -> rows
    surfaces: list[str] = field(default_factory=list)  # surfaces.yaml order = head order
    surface_tasks: list[list[str]] = field(default_factory=list)
    surface_loss_weights: dict[str, float] = field(default_factory=dict)  # default 1.0
    task_loss_weights: dict[str, float] = field(default_factory=lambda: {"click": 1.0, "conversion": 1.0})
    hist_max_len: int = 64

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or self.d_model // self.n_heads not in SUPPORTED_HEAD_DIMS:
            raise ValueError(
                f"d_model/n_heads = {self.d_model}/{self.n_heads} must be one of {SUPPORTED_HEAD_DIMS}"
            )
        if self.n_cls < 1:
            raise ValueError("n_cls must be >= 1")
        if self.attention not in ("jagged", "padded"):
            raise ValueError(f"attention must be 'jagged' or 'padded', not {self.attention!r}")

    @property
    def n_tokens(self) -> int:
        """Non-sequence tokens: one per sparse feature + one dense token + one sum-pooled
        target-attention token per target pair (the unnormalised pooling joins the interactions)."""
        return len(self.sparse_features) + 1 + len(self.target_pairs)

    @property
    def target_pairs(self) -> list[tuple[int, str]]:
        """(sparse feature index, history column) pairs that share an item table."""
        if not self.target_attention:
            return []
        return [
            (j, name)
            for j, (_, table) in enumerate(self.sparse_features)
            for name, source, h_table in self.history_columns
            if source == "item_id" and h_table == table
        ]

    @property
    def n_topic_stats(self) -> int:
        return 2 + int(self.topic_log_share) if self.topic_dim and self.target_pairs else 0

    @property
    def wide_inputs(self) -> list[str]:
        """The names of the dense input layer's and the wide path's columns, in order: the dense features, each
        target pair's match statistics (gem_model.models.target_attention), the topic statistics."""
        match = MATCH_STATS if self.exact_match else MATCH_STATS[:-1]
        topic = ["topic_mean", "topic_max", "topic_log_share"][:self.n_topic_stats]
        return [*self.dense_features, *(f"{col}:{m}" for _, col in self.target_pairs for m in match), *topic]

    @property
    def n_seq_summary(self) -> int:
        return self.n_cls + self.n_pma + self.n_recent + len(self.target_pairs)

    @property
    def seq_len(self) -> int:
        return min(self.max_hist_len or self.hist_max_len, self.hist_max_len)

    @classmethod
    def from_specs(
        cls,
        dims: dict[str, Any] | None = None,
        *,
        features: FeaturesConfig | None = None,
        surfaces: SurfacesConfig | None = None,
        surface_names: list[str] | None = None,
    ) -> GEMConfig:
        """Model dims (a preset's `model:` mapping) + features.yaml + surfaces.yaml."""
        from gem_model.config import load_features, load_surfaces

        features = features or load_features()
        surfaces = surfaces or load_surfaces()
        dims = dict(dims or {})
        if unknown := sorted(set(dims) - model_keys()):
            raise ValueError(f"unknown model key(s) {unknown}")
        names = surfaces.names
        return cls(
            **{
                **dims,
                "dense_features": [f.name for f in features.dense],
                "sparse_features": [[f.name, f.table] for f in features.sparse],
                "history_columns": [[c.name, c.source, c.table or ""] for c in features.history.columns],
                "tables": dict(features.tables),
                "surfaces": names,
                "surface_tasks": [list(surfaces.get(n).tasks) for n in names],
                "surface_loss_weights": {
                    n: float(dims.get("surface_loss_weights", {}).get(n, 1.0))
                    if surface_names is None or n in surface_names
                    else 0.0
                    for n in names
                },
                "hist_max_len": features.history.max_len,
            }
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GEMConfig:
        for k in RETIRED.keys() & d.keys():
            if RETIRED[k] is not None and d[k] != RETIRED[k]:
                raise ValueError(f"this checkpoint was trained with {k}={d[k]!r}, an option since removed")
        d = {k: v for k, v in d.items() if k not in RETIRED}
        if unknown := set(d) - {f.name for f in dataclasses.fields(cls)}:
            raise ValueError(f"unknown GEMConfig fields {sorted(unknown)}")
        # checkpoints saved before the exact-match statistic existed carry no such key: same shapes
        return cls(**{"exact_match": False, **d})


def model_keys() -> frozenset[str]:
    """The keys a preset's `model:` mapping may set."""
    return frozenset(f.name for f in dataclasses.fields(GEMConfig)) - SPEC_FIELDS
