"""The Data Docs pages, rendered here from GX's validation results (JSON) instead of by GX's site builder.

GX's own pages load about 14 scripts and stylesheets from public CDNs (and an image from a public bucket), so
offline their pass/fail icons and observed values do not render. These pages carry everything inline (no
script, no external URL): a partition's page lists every expectation with its status, observed value and
unexpected values; the suite page lists the rules; the index lists the runs.
"""

from __future__ import annotations

import json
from typing import Any

from gem_pipelines.html import esc, page, table

_MAX_OBSERVED = 200  # characters of an observed value or rule in check metadata
_MAX_CELL = 2000  # the same on a page, where a long column list should still show whole
PASSED, FAILED = "\u2714 passed", "\u2718 failed"  # heavy check mark / heavy ballot X: text, no icon font


def _short(value: Any, limit: int = _MAX_OBSERVED) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def column_of(kwargs: dict[str, Any]) -> str | None:
    if "column" in kwargs:
        return kwargs["column"]
    if "column_A" in kwargs:
        return f"{kwargs['column_A']},{kwargs['column_B']}"
    return None  # table-level expectation


def rule(kwargs: dict[str, Any]) -> str:
    """The expectation's arguments other than its column, e.g. `min_value=0, where click == 1`."""
    parts = []
    for k, v in kwargs.items():
        if k in ("column", "column_A", "column_B", "batch_id"):
            continue
        cond = v if k == "row_condition" and isinstance(v, dict) else None
        if cond and isinstance(cond.get("column"), dict) and "operator" in cond:
            parts.append(f"where {cond['column'].get('name')} {cond['operator']} {json.dumps(cond.get('parameter'))}")
        else:
            parts.append(f"{k}={json.dumps(v, default=str)}")
    return _short(", ".join(parts), _MAX_CELL)


def observed(r: dict[str, Any], limit: int = _MAX_OBSERVED) -> str:
    """What one expectation saw, from its JSON result: an error, `N unexpected (p%), e.g. [...]`, or the
    observed aggregate (with the mismatch of a column list)."""
    info = r.get("exception_info") or {}
    if info.get("raised_exception"):
        return _short(f"error: {info.get('exception_message')}", limit)
    res = r.get("result") or {}
    if res.get("unexpected_count") is not None:
        text = f"{res['unexpected_count']} unexpected ({res.get('unexpected_percent') or 0:.3g}%)"
        sample = res.get("partial_unexpected_list")
        return _short(text + (f", e.g. {json.dumps(sample[:5], default=str)}" if sample else ""), limit)
    if "observed_value" in res:
        mismatch = (res.get("details") or {}).get("mismatched")
        return _short(f"observed {json.dumps(res['observed_value'], default=str)}"
                      + (f"; mismatched {json.dumps(mismatch, default=str)}" if mismatch else ""), limit)
    return _short(res, limit) if res else ("passed" if r.get("success") else "failed")


def validation_page(result: dict[str, Any], *, table_name: str, partition: str, run_time: str, rows: int,
                    sampled: bool, links: dict[str, str]) -> str:
    """One validation run of one partition: a summary line, then every expectation, the failed ones first."""
    stats = result.get("statistics") or {}
    ok = bool(result.get("success"))
    cols = ["status", "expectation", "column", "rule", "observed", "unexpected"]
    body_rows, classes = [], []
    for r in sorted(result.get("results", []), key=lambda r: bool(r.get("success"))):  # stable: suite order
        cfg = r.get("expectation_config") or {}
        kwargs = cfg.get("kwargs") or {}
        res = r.get("result") or {}
        count = res.get("unexpected_count")
        body_rows.append([PASSED if r.get("success") else FAILED, cfg.get("type", ""), column_of(kwargs) or "(table)",
                          rule(kwargs), observed(r, _MAX_CELL), "" if count is None else count])
        classes.append("" if r.get("success") else "failed")
    nav = " · ".join(f'<a href="{esc(href)}">{esc(name)}</a>' for name, href in links.items())
    summary = (f'<p class="{"ok" if ok else "failed-text"}"><strong>{PASSED if ok else FAILED}</strong>: '
               f'{stats.get("successful_expectations", 0)} of {stats.get("evaluated_expectations", 0)} expectations met '
               f"on {rows} rows{' (a random sample of the partition)' if sampled else ''}.</p>"
               f'<p class="muted">table {esc(table_name)}, partition {esc(partition)}, run {esc(run_time)} UTC. {nav}</p>')
    return page(f"Expectation Validation Result: {partition or table_name}",
                summary + table(cols, body_rows, row_class=classes, table_id="results"))


def suite_page(spec: dict[str, Any]) -> str:
    """The rules of one suite (its `assets/expectations/<table>.json`)."""
    rows = [[e["type"], column_of(e["kwargs"]) or "(table)", rule(e["kwargs"]), e.get("notes") or ""]
            for e in spec["expectations"]]
    return page(f"Expectation suite: {spec['name']}", '<p><a href="../index.html">all validation runs</a></p>'
                + table(["expectation", "column", "rule", "notes"], rows))


def index_page(entries: list[tuple[str, dict[str, Any]]], suites: list[str]) -> str:
    """The newest validation runs (page href, manifest entry) and the suite pages."""
    rows = [[esc(e["table"]), f'<a href="{esc(href)}">{esc(e["partition"])}</a>', esc(e["run_time"]),
             PASSED if e["success"] else FAILED, f'{e["successful"]}/{e["evaluated"]}',
             f'{e["rows"]}{" (sample)" if e["sampled"] else ""}'] for href, e in entries]
    cols = ["table", "partition", "run time (UTC)", "status", "expectations met", "rows validated"]
    raw = frozenset(cols)  # escaped above: the partition cell is a link
    suite_links = "".join(f'<li><a href="expectations/{esc(s)}.html">{esc(s)}</a></li>' for s in suites)
    return page("GEM Data Docs", f"<p>Great Expectations validation runs of the lake partitions, newest first "
                f"({len(entries)} runs). Each partition's page shows every expectation with its observed value.</p>"
                "<h2>Validation runs</h2>"
                + table(cols, rows, row_class=["" if e["success"] else "failed" for _, e in entries], raw=raw,
                        table_id="validations")
                + f"<h2>Expectation suites</h2><ul>{suite_links}</ul>")
