"""run_foundation on a 5-day calendar, the registry, and the W&B wrapper."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import torch

from gem_model.config import CalendarConfig
from gem_model.models.registry import list_versions, load_model, new_version, read_accepted, write_accepted
from gem_model.train.foundation import run_foundation, write_eval_report
from gem_model.train.tracking import Tracker, scrub, wandb_mode

pytestmark = pytest.mark.timeout(300)


def test_run_foundation_writes_versions_and_rows(lake, gem_home):
    cal = CalendarConfig(start=dt.date(2026, 11, 1), days=5, teacher_lag_days=1)
    res = run_foundation("tiny", calendar=cal, device="cpu",
                         overrides={"train": {"max_steps": 8, "torch_threads": 1}})
    version = res["version"]
    assert list_versions("foundation_model") == [version]
    vdir = gem_home / "models" / "foundation_model" / version
    for name in ("model.pt", "checkpoint.pt", "metrics.json", "config.json", "eval_rows.json"):
        assert (vdir / name).exists(), name
    for s in ("feed", "reels", "marketplace", "shops"):
        bdir = gem_home / "models" / "single_surface_baseline" / s / version
        assert (bdir / "model.pt").exists()
        assert res["baselines"][s]["checkpoint"] == str(bdir / "model.pt")
    models = {r["model"] for r in res["rows"]}
    assert models == {"foundation", "single_surface"}
    teacher = [r for r in res["rows"] if r["model"] == "foundation"]
    assert {(r["surface"], r["task"]) for r in teacher} >= {("feed", "click"), ("reels", "click"), ("shops", "click")}
    assert ("reels", "conversion") not in {(r["surface"], r["task"]) for r in teacher}
    for r in res["rows"]:
        assert set(r) >= {"model", "surface", "task", "seed", "ne", "auc", "calibration", "oracle_ne", "n"}
    # a baseline only sees its own surface
    single = [r for r in res["rows"] if r["model"] == "single_surface"]
    assert sorted({r["surface"] for r in single}) == ["feed", "marketplace", "reels", "shops"]
    assert res["samples_per_s"] > 0 and res["loss_curve"]
    cfg = json.loads((vdir / "config.json").read_text())
    assert cfg["data"]["train"] == ["2026-11-02", "2026-11-02"]  # E-2-Δ = d2
    assert cfg["data"]["valid"] == "2026-11-04" and cfg["data"]["eval"] == "2026-11-05"
    # the baselines read their surface alone (gem_model.data.own_surface); the foundation reads every surface
    assert cfg["data"]["own_surface"] is False
    for s in ("feed", "shops"):
        b_cfg = json.loads((gem_home / "models" / "single_surface_baseline" / s / version / "config.json").read_text())
        assert b_cfg["data"]["surfaces"] == [s] and b_cfg["data"]["own_surface"] is True
    report = write_eval_report(res["rows"], gem_home / "reports" / "foundation_eval.json")
    assert json.loads(report.read_text())["rows"] == json.loads(json.dumps(res["rows"], default=str))

    # registry: nothing accepted until the gate says so
    assert read_accepted("foundation_model") is None
    write_accepted("foundation_model", version)
    assert read_accepted("foundation_model") == vdir
    model, config = load_model(read_accepted("foundation_model"))
    assert config["model_config"]["surfaces"] == ["feed", "reels", "marketplace", "shops"]
    assert not model.training


def test_an_interrupted_call_resumes_its_version(lake, gem_home):
    """run_foundation dying in its teacher continues, with resume, from the teacher's last checkpoint in the same
    version and trains the baselines; resumed again once finished, it trains nothing and returns the same rows."""
    cal = CalendarConfig(start=dt.date(2026, 11, 1), days=5, teacher_lag_days=1)
    train = {"max_steps": 8, "torch_threads": 1, "checkpoint_every": 2}
    common = {"calendar": cal, "device": "cpu", "version": new_version("resume")}
    with pytest.raises(RuntimeError, match="simulated failure at step 4"):
        run_foundation("tiny", overrides={"train": {**train, "fail_at_step": 4}}, **common)
    vdir = gem_home / "models" / "foundation_model" / common["version"]
    assert (vdir / "checkpoint.pt").is_file() and not (vdir / "metrics.json").exists()
    res = run_foundation("tiny", overrides={"train": train}, resume=True, **common)
    assert list_versions("foundation_model") == [common["version"]]
    teacher = json.loads((vdir / "metrics.json").read_text())
    assert (teacher["resumed_from_step"], teacher["step"]) == (4, 8)
    finished = {p: p.stat().st_mtime_ns for p in gem_home.glob("models/**/metrics.json")}
    assert len(finished) == 5  # the teacher and four baselines, none resumed (none had a checkpoint)
    assert all(json.loads(p.read_text())["resumed_from_step"] is None for p in finished if p.parent != vdir)
    again = run_foundation("tiny", overrides={"train": train}, resume=True, **common)
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # nothing retrained
    assert again["rows"] == res["rows"] and again["checkpoint"] == res["checkpoint"]


def test_registry_versions(gem_home):
    v = new_version("AbC-123xyz", now=dt.datetime(2026, 11, 29, 15, 30, tzinfo=dt.UTC))
    assert v == "20261129T153000Z-abc123"
    assert len(new_version().split("-")[1]) == 6
    with pytest.raises(FileNotFoundError, match="cannot accept a version that was never written"):
        write_accepted("foundation_model", v)
    with pytest.raises(ValueError, match=r"version '\.\./\.\./etc' is not <UTC time>-<run id>"):
        write_accepted("foundation_model", "../../etc")
    (gem_home / "models" / "single_surface_baseline" / "shops" / v).mkdir(parents=True)
    write_accepted("single_surface_baseline", v, partition="shops")
    assert read_accepted("single_surface_baseline", "shops").name == v
    assert read_accepted("single_surface_baseline", "feed") is None


def test_tracker_disabled_is_a_noop(gem_home, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    t = Tracker(config={"api_key": "x"})
    t.log({"a": 1})
    t.log_artifact(gem_home, "x")
    assert t.info()["run_id"] is None and not t.enabled
    assert not (gem_home / "wandb").exists()
    t.finish()


def test_a_wandb_mode_wandb_does_not_know_is_refused(gem_home, monkeypatch):
    """Read as unset, a typo of `disabled` would upload the run wherever WANDB_API_KEY is set."""
    monkeypatch.setenv("WANDB_API_KEY", "k")
    for typo in ("disabeld", "off"):
        monkeypatch.setenv("WANDB_MODE", typo)
        with pytest.raises(ValueError, match=f"WANDB_MODE='{typo}': must be disabled, offline, online or dryrun"):
            Tracker()
    monkeypatch.delenv("WANDB_MODE")
    assert wandb_mode() == "online"
    monkeypatch.delenv("WANDB_API_KEY")
    assert wandb_mode() == "offline"


def test_scrub_hides_secrets():
    out = scrub({"lr": 1, "aws_secret_access_key": "s", "nested": {"WANDB_API_KEY": "k", "ok": [1, {"token": 2}]}})
    assert out == {"lr": 1, "aws_secret_access_key": "<redacted>",
                   "nested": {"WANDB_API_KEY": "<redacted>", "ok": [1, {"token": "<redacted>"}]}}


@pytest.mark.timeout(120)
def test_tracker_offline_writes_under_gem_home(gem_home, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for k in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.delenv(k, raising=False)
    f = gem_home / "w.pt"
    torch.save({"x": torch.zeros(1)}, f)
    with Tracker(project="gem-test", name="t", group="g", config={"lr": 1}) as t:
        t.log({"loss": 0.5}, step=1)
        t.log_artifact(f, "ckpt")
        info = t.info()
    assert info["run_id"] and info["url"] is None and info["group"] == "g"
    assert str(gem_home / "wandb") in info["run_dir"]
