"""gem_model.train.config: a typo in a preset, a dataset's preset or a run config is an error naming the key
(and the file it comes from), and every training key is read by the training code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gem_model.config import ASSETS_DIR, ConfigError
from gem_model.models import GEMConfig
from gem_model.train.config import TrainConfig, load_config_file, load_preset, resolve_config

RUN = {"preset": "tiny", "data": {"train": ["2026-11-02", "2026-11-03"]}, "out_dir": "x"}


def _preset(tmp_path: Path, **sections) -> Path:
    raw = yaml.safe_load((ASSETS_DIR / "models" / "tiny.yaml").read_text())
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("data", ["sim", "douban"])
@pytest.mark.parametrize("preset", ["tiny", "small", "base", "large"])
def test_every_shipped_preset_resolves(preset: str, data: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_DATA", data)
    cfg = resolve_config({**RUN, "preset": preset})
    assert set(cfg["train"]) == set(TrainConfig.model_fields)
    GEMConfig.from_specs(cfg["model"])


def test_an_unknown_training_key_in_a_preset_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = _preset(tmp_path, train={"warmup_stpes": 5})
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: key 'train.warmup_stpes'"):
        load_preset(path)


def test_an_unknown_model_key_in_a_preset_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = _preset(tmp_path, model={"n_block": 2})
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: key 'model': Value error, unknown model key\(s\) \['n_block'\]"):
        load_preset(path)
    with pytest.raises(ValueError, match=r"unknown model key\(s\) \['n_block'\]"):  # and where the model is built
        GEMConfig.from_specs({"n_block": 2})
    with pytest.raises(ValueError, match=r"\['tables'\]"):  # the specs' fields come from features.yaml, not a preset
        GEMConfig.from_specs({"tables": {"user": 8}})


def test_an_unknown_key_in_a_run_config_names_the_key_and_its_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run config: key 'train.epoch'"):
        resolve_config({**RUN, "train": {"epoch": 2}})
    with pytest.raises(ConfigError, match=r"key 'data.valdi'"):
        resolve_config({**RUN, "data": {**RUN["data"], "valdi": "2026-11-04"}})
    with pytest.raises(ConfigError, match=r"key 'train.item_svd.dims'"):  # the start-up fits' own keys too
        resolve_config({**RUN, "train": {"item_svd": {"dims": 8}}})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**RUN, "train": {"patiense": 3}}))
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: key 'train.patiense'"):
        load_config_file(path)
    path.write_text(yaml.safe_dump({**RUN, "train": {"patience": 3}}))
    assert load_config_file(path)["train"] == {"patience": 3}


def test_resolution_fills_defaults_and_keeps_plain_data() -> None:
    cfg = resolve_config({**RUN, "data": {"train": "2026-11-02"}, "train": {"wide_prior": {"features": ["user_id"], "l2": 1}}})
    assert cfg["data"]["train"] == ["2026-11-02", "2026-11-02"]
    assert cfg["train"]["wide_prior"] == {"features": ["user_id"], "l2": 1.0, "passes": 1}
    assert cfg["train"]["item_svd"] is None and cfg["train"]["epochs"] == 1  # tiny.yaml's
    with pytest.raises(ValueError, match="data.train"):
        resolve_config({"preset": "tiny", "data": {}})
    svd = resolve_config({**RUN, "train": {"item_svd": {"dim": 8}}})["train"]["item_svd"]
    assert svd["serve_fold_in"] is True and svd["serve_slices"] == 4  # a day served in four slices
    with pytest.raises(ValueError, match="divide 24"):
        resolve_config({**RUN, "train": {"item_svd": {"dim": 8, "serve_slices": 5}}})


def test_every_training_key_is_read_by_the_training_code() -> None:
    src = "".join((Path(__file__).resolve().parents[2] / "gem_model" / "train" / f).read_text()
                  for f in ("loop.py", "startup.py", "streams.py", "refresh.py"))
    unread = [k for k in TrainConfig.model_fields if f'"{k}"' not in src and f"'{k}'" not in src]
    assert not unread, f"training keys no code reads: {unread}"
