"""Each importer on its shared sample: every row accounted for (imported + quarantined = read, per
file), the split rules, histories, the Ali-CCP purchase rule, and malformed real rows quarantined."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import polars as pl
import pytest

from gem_model.config import SOURCES_DIR, load_calendar, load_surfaces
from gem_pipelines.sources.common import PURCHASE_WITHOUT_CLICK, load_source
from tests.sources.helpers import account, data_rows, need, normalize_all, run_import

# (dataset, sample folder, files with a header line?)
SAMPLES = [("douban", "douban_multidomain", True), ("taobao", "taobao_display_ad", False),
           ("aliccp", "aliccp", True), ("mind", "mind_multidomain", True)]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object, dict]]:
    """Every dataset imported once and every partition normalised (shared by the tests below)."""
    out = {}
    for dataset, _, _ in SAMPLES:
        home = tmp_path_factory.mktemp(dataset)
        result = run_import(dataset, home)
        out[dataset] = (home, result, normalize_all(dataset, home))
    return out


@pytest.mark.parametrize(("dataset", "folder", "header"), SAMPLES)
def test_every_row_is_imported_or_quarantined(imported, dataset: str, folder: str, header: bool) -> None:
    home, result, parts = imported[dataset]
    table = account(dataset, home, parts)
    cfg = load_source(dataset)
    expected = {name: data_rows(need(folder) / name, header) for names in cfg.files.values() for name in names}
    assert dict(zip(table["source_file"], table["read"], strict=True)) == expected
    assert result.files == expected
    assert (table["imported"] + table["quarantined"] == table["read"]).all(), table
    # the samples are clean: every row becomes one events row
    assert table["quarantined"].sum() == 0 and table["imported"].sum() == sum(expected.values())
    # landing raw records = what the parsers count, partition by partition
    for (day, surface), p in parts.items():
        assert p.raw_records == result.partitions[f"{day.isoformat()}|{surface}"]


def test_douban_split_keeps_the_files_roles(imported) -> None:
    home, _, parts = imported["douban"]
    roles = load_calendar(SOURCES_DIR / "douban" / "calendar.yaml").roles()
    events = pl.concat([p.events for p in parts.values()])
    file_of = pl.col("request_id").str.split(":").list.first().str.strip_suffix(".csv")
    by = events.with_columns(f=file_of).group_by("f").agg(pl.col("date").unique().sort())
    dates = {f: d for f, d in by.iter_rows()}
    for surface in ("music", "book", "movie"):
        assert dates[f"douban_{surface}_test"] == [roles.evaluation]
    for surface in ("music", "book"):
        assert dates[f"douban_{surface}_val"] == [roles.validation]
        train_days = dates[f"douban_{surface}_train"]
        assert min(train_days) == roles.warmup and max(train_days) == roles.student[1]
    # movie has no train file: about half of its val rows (seeded) train, none of its test rows do
    movie_val = events.filter(file_of == "douban_movie_val")
    share = movie_val.filter(pl.col("date") < roles.validation).height / movie_val.height
    assert 0.45 < share < 0.55
    teacher = events.filter((pl.col("date") >= roles.teacher[0]) & (pl.col("date") <= roles.teacher[1]))
    assert set(teacher["surface"]) == {"music", "book", "movie"}
    # item ids stay disjoint per domain, as in the data
    items = events.group_by("surface").agg(pl.col("ad_id").unique())
    sets = [set(v) for v in items["ad_id"]]
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
    # no time in the data: every impression at noon of its day, clicks one second later
    assert (events["ts"].dt.hour() == 12).all()


def test_import_is_deterministic(imported, tmp_path: Path) -> None:
    home, _, _ = imported["douban"]
    run_import("douban", tmp_path)
    files = sorted((home / "landing").rglob("feed.jsonl"))[:6]
    assert len(files) == 6  # the comparison below ran on six files, not none
    for f in files:
        assert f.read_bytes() == (tmp_path / f.relative_to(home)).read_bytes()


@pytest.mark.parametrize("dataset", ["taobao", "mind"])
def test_per_user_split_without_time(imported, dataset: str) -> None:
    _, _, parts = imported[dataset]
    roles = load_calendar(SOURCES_DIR / dataset / "calendar.yaml").roles()
    events = pl.concat([p.events for p in parts.values()])
    role = (pl.when(pl.col("date") == roles.evaluation).then(pl.lit("test"))
            .when(pl.col("date") == roles.validation).then(pl.lit("val")).otherwise(pl.lit("train")))
    per_user = events.with_columns(role=role).group_by("user_id").agg(pl.col("role").n_unique())
    assert (per_user["role"] == 1).all()  # a user is in one role only
    assert events.filter(role == "test").height > 0 and events.filter(role == "val").height > 0


def test_douban_unclicked_ratings_become_views(imported) -> None:
    """source.yaml `unclicked_as: view`: each row labelled 0 is also an organic view of its item at the
    impression's own time (so only later days' histories hold it); clicked rows add no organic row."""
    assert load_source("douban").unclicked_as == "view"
    home, result, parts = imported["douban"]
    organic = pl.concat([p.organic for p in parts.values()])
    events = pl.concat([p.events for p in parts.values()])
    unclicked = events.filter(pl.col("click") == 0)
    assert organic.height == result.history_records > 0
    assert set(organic["action"]) == {"view"}
    key = ["user_id", "ts", "surface"]
    pairs = organic.select(*key, item=pl.col("item_id").cast(pl.String)).sort(*key, "item")
    # one view per (user, item, day): an item rated twice on a day is viewed once
    expect = unclicked.select(*key, item=pl.col("ad_id").cast(pl.String)).unique().sort(*key, "item")
    assert pairs.equals(expect)


def test_taobao_sequences_become_history(imported) -> None:
    home, result, parts = imported["taobao"]
    organic = pl.concat([p.organic for p in parts.values()])
    assert organic.height == result.history_records > 0
    assert set(organic["action"]) <= {"view", "save", "like", "click"}
    events = pl.concat([p.events for p in parts.values()])
    assert (organic["ts"].dt.hour() == 0).all() and (events["ts"].dt.hour() == 12).all()
    assert set(events["surface"]) == {"pid_0", "pid_1"}
    # the first sample row: its 50-step sequence, masked steps only, items from brand_his
    first = (need("taobao_display_ad") / "alimama_sampled_train_dmr.txt").read_text().split("\n")[0].split(",")
    brands = {first[100 + k] for k in range(50) if first[150 + k] == "1"}
    user = organic.filter(pl.col("user_id") == int(first[250]))
    assert brands <= {str(i) for i in user["item_id"]}


def test_aliccp_purchase_without_click_rule(tmp_path: Path) -> None:
    src = need("aliccp")
    rows = pl.read_csv(src / "aliccp_paddlerec_aitm_train.csv")
    quirk = rows.filter((pl.col("purchase") == 1) & (pl.col("click") == 0)).height
    assert quirk == 2  # the real quirk the README names
    base = load_source("aliccp").model_dump()
    base["files"] = {"train": ("aliccp_paddlerec_aitm_train.csv",)}
    found = {}
    for rule in ("drop_purchase", "keep"):
        home = tmp_path / rule
        cfg = type(load_source("aliccp")).model_validate({**base, "purchase_without_click": rule})
        result = run_import("aliccp", home, src, cfg)
        assert result.notes[PURCHASE_WITHOUT_CLICK] == 2
        events = pl.concat([p.events for p in normalize_all("aliccp", home).values()])
        assert events.height == 48
        found[rule] = events.filter((pl.col("click") == 0) & (pl.col("conversion") == 1)).height
        manifest = json.loads((home / "imports" / "aliccp" / "manifest.json").read_text())
        assert manifest["notes"]["purchase_without_click_rule"] == rule
    assert found == {"drop_purchase": 0, "keep": 2}


def test_malformed_real_rows_are_quarantined_with_a_reason(tmp_path: Path) -> None:
    """Real Douban rows, some broken the ways real files break: each lands in quarantine with its
    code and the original text, and the per-file count still closes."""
    lines = (need("douban_multidomain") / "douban_music_test.csv").read_text().split("\n")[:41]
    head, body = lines[0], lines[1:]
    broken = {
        3: ("0,1207,4035", "unparseable"),  # a field short
        5: ("0,1207,4035,1,9", "unparseable"),  # a field too many
        7: ("0,abc,4035,1", "bad_type"),  # user id not an integer
        9: ("0,1207,,1", "missing_id"),  # empty item id
        11: ("0,1207,4035,2", "bad_type"),  # label not 0/1
        13: ("7,1207,4035,1", "unknown_enum"),  # a domain the dataset does not declare
        15: ("", "unparseable"),  # a blank line
    }
    for i, (text, _) in broken.items():
        body[i] = text
    src = tmp_path / "src"
    src.mkdir()
    (src / "douban_music_test.csv").write_text("\n".join([head, *body]) + "\n")
    base = load_source("douban").model_dump()
    cfg = type(load_source("douban")).model_validate({**base, "files": {"test": ("douban_music_test.csv",)}})
    home = tmp_path / "home"
    result = run_import("douban", home, src, cfg)
    assert result.unmapped == {"douban_music_test.csv": 4}
    parts = normalize_all("douban", home)
    table = account("douban", home, parts).row(0, named=True)
    assert table == {"source_file": "douban_music_test.csv", "read": 40, "imported": 33, "quarantined": 7}
    q = pl.concat([p.quarantine for p in parts.values()])
    lineage = pl.read_parquet(home / "imports" / "douban" / "lineage.parquet")
    q = q.join(lineage, left_on=["surface", "date", "line_no"], right_on=["surface", "date", "feed_line"])
    got = dict(zip(q["line_no_right"].to_list(), q["reason"].to_list(), strict=True))
    assert got == {i + 2: reason for i, (_, reason) in broken.items()}  # file line = index + header + 1
    raw = dict(zip(q["line_no_right"].to_list(), q["raw"].to_list(), strict=True))
    assert raw[3 + 2] == "0,1207,4035" and raw[15 + 2] == ""


def test_source_config_rejects_paths_and_unknown_roles() -> None:
    base = load_source("douban").model_dump()
    model = type(load_source("douban"))
    for files, why in (({"train": ("../etc/passwd",)}, "must be a plain file name"),
                       ({"train": ("a/b.csv",)}, "must be a plain file name"), ({"later": ("x.csv",)}, "files.later")):
        with pytest.raises(ValueError, match=why):
            model.model_validate({**base, "files": files})
    with pytest.raises(ValueError, match=r"surface 'Music!' must match"):
        model.model_validate({**base, "surfaces": {"0": "Music!"}})


def test_every_dataset_declares_valid_specs() -> None:
    for dataset, _, _ in SAMPLES:
        cfg = load_source(dataset)
        surfaces = load_surfaces(SOURCES_DIR / dataset / "surfaces.yaml")
        assert set(cfg.surfaces.values()) == set(surfaces.names)
        assert all(s.format == "jsonl_nested" for s in surfaces.surfaces)
        cal = load_calendar(SOURCES_DIR / dataset / "calendar.yaml")
        assert cal.end() - cal.start >= dt.timedelta(days=4)


# What the Douban, MIND and Ali-CCP modules landed before their specs replaced them (imports/<dataset>/
# manifest.json `partitions` of the last module version, commits a96fea8 and 7f9c968): records per "<date>|<surface>".
MODULE_PARTITIONS = {
    "douban": {"2026-11-01|book": 9835, "2026-11-01|movie": 7893, "2026-11-01|music": 316, "2026-11-02|book": 24757,
               "2026-11-02|movie": 19413, "2026-11-02|music": 785, "2026-11-03|book": 24465, "2026-11-03|movie": 19717,
               "2026-11-03|music": 761, "2026-11-04|book": 24523, "2026-11-04|movie": 19724, "2026-11-04|music": 797,
               "2026-11-05|book": 14744, "2026-11-05|movie": 11974, "2026-11-05|music": 394, "2026-11-06|book": 12268,
               "2026-11-06|movie": 78986, "2026-11-06|music": 367, "2026-11-07|book": 12279,
               "2026-11-07|movie": 157395, "2026-11-07|music": 381},
    "mind": {"2026-11-01|finance": 89, "2026-11-01|lifestyle": 125, "2026-11-01|news": 297, "2026-11-01|sports": 132,
             "2026-11-02|finance": 268, "2026-11-02|lifestyle": 302, "2026-11-02|news": 744, "2026-11-02|sports": 281,
             "2026-11-03|finance": 282, "2026-11-03|lifestyle": 285, "2026-11-03|news": 776, "2026-11-03|sports": 286,
             "2026-11-04|finance": 241, "2026-11-04|lifestyle": 339, "2026-11-04|news": 788, "2026-11-04|sports": 273,
             "2026-11-05|finance": 130, "2026-11-05|lifestyle": 197, "2026-11-05|news": 420, "2026-11-05|sports": 168,
             "2026-11-06|finance": 128, "2026-11-06|lifestyle": 174, "2026-11-06|news": 358, "2026-11-06|sports": 123,
             "2026-11-07|finance": 127, "2026-11-07|lifestyle": 143, "2026-11-07|news": 359, "2026-11-07|sports": 165},
    "aliccp": {"2026-11-01|scenario_1": 4, "2026-11-01|scenario_2": 0, "2026-11-01|scenario_3": 4,
               "2026-11-02|scenario_1": 21, "2026-11-02|scenario_2": 5, "2026-11-02|scenario_3": 1,
               "2026-11-03|scenario_1": 20, "2026-11-03|scenario_2": 7, "2026-11-03|scenario_3": 2,
               "2026-11-04|scenario_1": 15, "2026-11-04|scenario_2": 4, "2026-11-04|scenario_3": 2,
               "2026-11-05|scenario_1": 9, "2026-11-05|scenario_2": 3, "2026-11-05|scenario_3": 3,
               "2026-11-06|scenario_1": 38, "2026-11-06|scenario_2": 7, "2026-11-06|scenario_3": 5,
               "2026-11-07|scenario_1": 39, "2026-11-07|scenario_2": 6, "2026-11-07|scenario_3": 5},
}
MODULE_HISTORY_RECORDS = {"douban": 115926, "mind": 0, "aliccp": 0}
MODULE_NOTES = {"douban": {}, "mind": {}, "aliccp": {PURCHASE_WITHOUT_CLICK: 0, "purchase_without_click_rule": "drop_purchase"}}


def _blake31(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") >> 1


def _expected_rows(dataset: str) -> pl.DataFrame:
    """Each raw line's impression, read with polars alone: request id `<file name>:<line>`, surface, ids, labels."""
    cfg = load_source(dataset)
    frames = []
    for name in (n for names in cfg.files.values() for n in names):
        df = pl.read_csv(need(Path(cfg.default_dir).name) / name, infer_schema=False).with_row_index("i")
        rid = pl.lit(name + ":") + (pl.col("i") + 2).cast(pl.String)  # line 1 is the header
        if dataset == "douban":
            frames.append(df.select(request_id=rid, surface=pl.col("0").replace_strict(cfg.surfaces),
                                    user_id=pl.col("1").cast(pl.Int64), ad_id=pl.col("2").cast(pl.Int64),
                                    advertiser_id=pl.col("2").cast(pl.Int64), click=pl.col("3").cast(pl.Int8)))
        elif dataset == "aliccp":  # the sample has no purchase without a click: conversion as the file says
            frames.append(df.select(request_id=rid, surface=pl.col("301").replace_strict(cfg.surfaces),
                                    user_id=pl.col("101").cast(pl.Int64), ad_id=pl.col("205").cast(pl.Int64),
                                    advertiser_id=pl.col("207").cast(pl.Int64), click=pl.col("click").cast(pl.Int8),
                                    conversion=pl.col("purchase").cast(pl.Int8)))
        else:
            frames.append(df.select(
                request_id=rid, surface=pl.col("Category").replace_strict(cfg.surfaces),
                user_id=pl.col("User_ID").str.slice(1).cast(pl.Int64), ad_id=pl.col("News_ID").str.slice(1).cast(pl.Int64),
                advertiser_id=pl.col("SubCategory").map_elements(_blake31, return_dtype=pl.Int64),
                click=pl.col("label").cast(pl.Int8)))
    return pl.concat(frames).sort("request_id")


@pytest.mark.parametrize("dataset", ["douban", "mind", "aliccp"])
def test_spec_lands_the_rows_the_module_landed(imported, dataset: str) -> None:
    """The spec that replaced the dataset's module: every raw line lands as the same impression (recomputed
    from the raw file with polars), on the days the module put it (its partition counts)."""
    _, result, parts = imported[dataset]
    events = pl.concat([p.events for p in parts.values()])
    expected = _expected_rows(dataset)
    assert events.select(expected.columns).sort("request_id").equals(expected)
    assert result.partitions == MODULE_PARTITIONS[dataset]
    assert result.history_records == MODULE_HISTORY_RECORDS[dataset]
    assert result.notes == MODULE_NOTES[dataset]
