"""Ali-CCP as Tianchi distributes it (sample_skeleton + common_features, no header, feature lists
`field\\x02id\\x03value` joined by \\x01): the importer reads that layout unchanged. The shared
samples hold only the label-encoded CSV layouts, so the files here are small hand-made ones."""

from __future__ import annotations

import polars as pl
import pytest

from gem_pipelines.sources.aliccp import tianchi_field
from gem_pipelines.sources.common import PURCHASE_WITHOUT_CLICK, load_source
from tests.sources.helpers import account, normalize_all, run_import

S1, S2, UNDECLARED = "9351665", "9351666", "9351999"


def feats(*pairs: tuple[str, str]) -> str:
    return "\x01".join(f"{f}\x02{i}\x031.0" for f, i in pairs)


COMMON = [("u1md5", "2", feats(("101", "7001"), ("121", "5"))), ("u2md5", "1", feats(("101", "7002")))]
SKELETON = [  # sample id, click, purchase, md5, feature count, feature list
    ("1", "1", "1", "u1md5", "4", feats(("205", "501"), ("206", "9"), ("207", "601"), ("301", S1))),
    ("2", "0", "0", "u1md5", "3", feats(("205", "502"), ("207", "602"), ("301", S2))),
    ("3", "0", "1", "u2md5", "3", feats(("205", "503"), ("207", "603"), ("301", S1))),  # purchase, no click
    ("4", "1", "0", "nomd5", "3", feats(("205", "504"), ("207", "604"), ("301", S2))),  # no common features
    ("5", "1", "0", "u2md5", "3", feats(("205", "505"), ("207", "605"), ("301", UNDECLARED))),
    ("6", "1", "0", "u2md5"),  # fields missing
]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory):
    src = tmp_path_factory.mktemp("aliccp_full")
    (src / "sample_skeleton_train.csv").write_text("".join(",".join(r) + "\n" for r in SKELETON[:4]))
    (src / "sample_skeleton_test.csv").write_text("".join(",".join(r) + "\n" for r in SKELETON[4:]))
    (src / "common_features_train.csv").write_text("".join(",".join(r) + "\n" for r in COMMON[:1]))
    (src / "common_features_test.csv").write_text("".join(",".join(r) + "\n" for r in COMMON[1:]))
    home = tmp_path_factory.mktemp("home")
    result = run_import("aliccp_full", home, src)
    return home, result, normalize_all("aliccp_full", home)


def test_feature_lists_are_read_by_field() -> None:
    df = pl.DataFrame({"f": [feats(("205", "1"), ("2050", "9"), ("301", "3")), feats(("101", "8")), None]})
    got = df.select(a=tianchi_field(pl.col("f"), "205"), b=tianchi_field(pl.col("f"), "301"),
                    c=tianchi_field(pl.col("f"), "050"))
    assert got.to_dicts() == [{"a": "1", "b": "3", "c": None}, {"a": None, "b": None, "c": None},
                              {"a": None, "b": None, "c": None}]


def test_every_sample_is_imported_or_quarantined(imported) -> None:
    home, result, parts = imported
    assert result.files == {"sample_skeleton_train.csv": 4, "sample_skeleton_test.csv": 2}
    table = account("aliccp_full", home, parts)
    assert (table["imported"] + table["quarantined"] == table["read"]).all(), table
    assert table["imported"].sum() == 3
    q = pl.concat([p.quarantine for p in parts.values()])
    assert sorted(q["reason"].to_list()) == ["missing_id", "unknown_enum", "unparseable"]  # the undeclared scenario: unknown_enum


def test_user_from_common_features_and_the_purchase_rule(imported) -> None:
    _, result, parts = imported
    events = pl.concat([p.events for p in parts.values()]).sort("request_id")
    assert events["request_id"].to_list() == ["sample_skeleton_train.csv:1", "sample_skeleton_train.csv:2",
                                              "sample_skeleton_train.csv:3"]
    assert events["user_id"].to_list() == [7001, 7001, 7002]
    assert events["ad_id"].to_list() == [501, 502, 503] and events["advertiser_id"].to_list() == [601, 602, 603]
    assert events["surface"].to_list() == ["scenario_1", "scenario_2", "scenario_1"]
    assert events["click"].to_list() == [1, 0, 0] and events["conversion"].to_list() == [1, 0, 0]
    assert result.notes[PURCHASE_WITHOUT_CLICK] == 1  # sample 3: purchase dropped (drop_purchase)
    assert load_source("aliccp_full").common
