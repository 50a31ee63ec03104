"""The raw formats surfaces emit, the unified lake schemas, and the quarantine reason codes.

This module is the contract between the simulator (which writes raw files) and the parsers
(which read them). Every timestamp is UTC. Files of partition D live in
`landing/<surface>/<D>/`; click and conversion events are filed under their impression's date and
may be up to 24 h later than it.

jsonl_nested  (file `feed.jsonl`, one JSON object a line)
    ad impression: {"kind": "ad", "request_id": str, "ts": ISO-8601 str ending in "Z",
                    "user": {"id": int, "device": str, "tenure_days": float},
                    "ad": {"id": int, "advertiser_id": int, "objective": str,
                           "creative_format": str, "bid": float},
                    "slot": {"position": int},
                    "engagement": {"click": bool, "click_ts": str | null,
                                   "conversion": bool | null, "conversion_ts": str | null},
                    "context": {name: str | number | null, ...}}  (optional: a dataset's own log
                    columns, features.yaml `context: true`; the generic importer writes them)
    organic:       {"kind": "organic", "ts": str, "user": {"id": int}, "item_id": int, "action": str}

csv_ms  (files `impressions.csv` and `activity.csv`, comma separated, header line, empty = null,
        times as epoch milliseconds)
    impressions.csv: req_id,event_time_ms,uid,device_type,tenure_d,ad,advertiser,objective,
                     format,slot,bid_usd,clicked,click_time_ms,converted,conversion_time_ms
                     (clicked/converted are 0/1)
    activity.csv:    uid,event_time_ms,item,action

parquet  (files `impressions.parquet` and `activity.parquet`; columnar export)
    impressions.parquet: request_id str, ts timestamp[us, UTC], user_id int64, device str,
                         user_tenure_days float64, ad_id int64, advertiser_id int64, objective str,
                         creative_format str, position int32, bid float64, click bool,
                         click_ts timestamp[us, UTC], conversion bool, conversion_ts timestamp[us, UTC]
    activity.parquet:    user_id int64, ts timestamp[us, UTC], item_id int64, action str

event_stream  (file `events.jsonl`; impression, click, conversion arrive as separate events)
    {"event": "impression", "request_id": str, "ts": float epoch seconds,
     "payload": {"user_id": int, "device": str, "tenure_days": float, "ad_id": int,
                 "advertiser_id": int, "objective": str, "creative_format": str,
                 "position": int, "bid": float}}
    {"event": "click" | "conversion", "request_id": str, "ts": float}
    {"event": "organic", "ts": float, "payload": {"user_id": int, "item_id": int, "action": str}}
    An impression with no click event has click = 0; on a surface whose tasks include conversion,
    no conversion event means conversion = 0, otherwise conversion is null.

Item ids: ads and organic items share one id space (in the static simulated world ads 1..n_ads,
organic items above; churn adds new ids of both above that), so an ad clicked in the past appears
in histories with the same id it has as a candidate.
"""

from __future__ import annotations

from gem_model.store.schemas import (  # noqa: F401  (re-exported: the lake contract)
    ACTIONS,
    COUNTER_COLUMNS,
    CREATIVE_FORMATS,
    DEVICES,
    EVENTS_SCHEMA,
    HISTORY_COLUMNS,
    OBJECTIVES,
    ORACLE_SCHEMA,
    ORGANIC_ACTIONS,
    PAID_ACTIONS,
    QUARANTINE_SCHEMA,
    SOURCES,
    TODAY_COUNTER_COLUMNS,
    TRAINING_EXAMPLES_SCHEMA,
    USER_ACTIVITY_SCHEMA,
    UTC_US,
    events_schema,
    training_examples_schema,
)

LANDING_FILES: dict[str, tuple[str, ...]] = {
    "jsonl_nested": ("feed.jsonl",),
    "csv_ms": ("impressions.csv", "activity.csv"),
    "parquet": ("impressions.parquet", "activity.parquet"),
    "event_stream": ("events.jsonl",),
}

# Quarantine reason codes: every quarantined record carries exactly one of these.
REASONS: dict[str, str] = {
    "unparseable": "the line is not a record of the format (invalid JSON, more CSV fields than the header, broken quoting, "
    "blank line, invalid UTF-8: kept with its bytes as \\x escapes)",
    "truncated": "the line ends mid-record (JSON cut off, fewer CSV fields than the header)",
    "missing_id": "a required id (request_id, user_id, ad_id, advertiser_id, item_id) is missing or empty",
    "bad_type": "a field has the wrong type or cannot be cast (e.g. bid='abc', position=2.5), or a click/conversion "
    "without its time",
    "out_of_range_value": "a numeric field is outside its domain (negative or non-finite bid/tenure, a negative id, "
    "position outside 1..50)",
    "out_of_range_ts": "an impression/activity timestamp outside the partition's day, or a click/conversion "
    "before its impression or more than 24 h after it",
    "unknown_enum": "objective, creative_format, device, action, record kind or event type not in the allowed set",
    "duplicate_record": "a later copy of a request_id, click/conversion event or activity record already seen",
    "orphan_event": "a click or conversion whose request_id has no impression in the same partition",
    "unexpected_label": "a conversion on a surface that does not log conversions",
}
REASON_CODES = tuple(REASONS)

_IMPRESSION = ("request_id", "ts", "user_id", "device", "user_tenure_days", "ad_id", "advertiser_id", "objective",
               "creative_format", "position", "bid", "click", "click_ts", "conversion", "conversion_ts")  # fmt: skip
_ACTIVITY = ("user_id", "ts", "item_id", "action")
_EVENT_PAYLOAD = ("user_id", "device", "user_tenure_days", "ad_id", "advertiser_id", "objective", "creative_format",
                  "position", "bid")  # fmt: skip
# Where each staging field lives in a record of each format ("impression" or "organic"): a JSON path, or a
# CSV/Parquet column, in the order the format writes them. The simulator writes and corrupts records by
# these, the parsers read them.
RECORD_FIELDS: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {
    "jsonl_nested": {
        "impression": {
            "kind": ("kind",), "request_id": ("request_id",), "ts": ("ts",), "user_id": ("user", "id"),
            "device": ("user", "device"), "user_tenure_days": ("user", "tenure_days"), "ad_id": ("ad", "id"),
            **{f: ("ad", f) for f in ("advertiser_id", "objective", "creative_format", "bid")},
            "position": ("slot", "position"),
            **{f: ("engagement", f) for f in ("click", "click_ts", "conversion", "conversion_ts")},
        },
        "organic": {"kind": ("kind",), "ts": ("ts",), "user_id": ("user", "id"), "item_id": ("item_id",),
                    "action": ("action",)},
    },
    "event_stream": {
        "impression": {"kind": ("event",), "request_id": ("request_id",), "ts": ("ts",),
                       **{f: ("payload", "tenure_days" if f == "user_tenure_days" else f) for f in _EVENT_PAYLOAD}},
        "organic": {"kind": ("event",), "ts": ("ts",), **{f: ("payload", f) for f in ("user_id", "item_id", "action")}},
    },
    "csv_ms": {
        "impression": {f: (c,) for f, c in zip(_IMPRESSION, (
            "req_id", "event_time_ms", "uid", "device_type", "tenure_d", "ad", "advertiser", "objective", "format",
            "slot", "bid_usd", "clicked", "click_time_ms", "converted", "conversion_time_ms"), strict=True)},
        "organic": {f: (c,) for f, c in zip(_ACTIVITY, ("uid", "event_time_ms", "item", "action"), strict=True)},
    },
    "parquet": {"impression": {f: (f,) for f in _IMPRESSION}, "organic": {f: (f,) for f in _ACTIVITY}},
}  # fmt: skip


def path_tree(fields: dict[str, tuple[str, ...]]) -> dict[str, object]:
    """The paths of `fields` as nested dicts in first-seen order; a leaf holds its staging field's name."""
    tree: dict[str, object] = {}
    for name, path in fields.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})  # type: ignore[assignment]
        node[path[-1]] = name
    return tree
