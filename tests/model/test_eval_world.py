"""The evaluation world of `make eval` (assets/simulator_eval.yaml): every surface has the click
positives on E that a per-surface confidence interval needs; it is the demo world otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gem_model.config import ConfigError, load_calendar, load_simulator, load_surfaces
from gem_pipelines.data.simulator import simulate_day_frames

MIN_POSITIVES = 300  # issue 9: >= 300 click positives per surface on E


def test_eval_world_has_enough_click_positives_on_every_surface(monkeypatch):
    monkeypatch.setenv("GEM_SIMULATOR", "eval")
    cfg, surfaces = load_simulator(), load_surfaces()
    e_day = load_calendar(days=7).roles().evaluation  # the demo calendar's E (no next-day extension)
    clicks = {s: int(simulate_day_frames(cfg, surfaces, s, e_day)[0]["click"].sum()) for s in surfaces.names}
    assert min(clicks.values()) >= MIN_POSITIVES, clicks


def test_eval_world_is_the_demo_world_with_more_traffic(monkeypatch):
    demo = load_simulator()
    monkeypatch.setenv("GEM_SIMULATOR", "eval")
    ev = load_simulator()
    same = {k for k in demo.model_fields if k not in ("impressions_per_day", "traffic_share")}
    assert {k: getattr(ev, k) for k in same} == {k: getattr(demo, k) for k in same}
    assert ev.impressions_per_day > demo.impressions_per_day
    shops = load_surfaces().get("shops")
    assert ev.share(shops) > demo.share(shops) == shops.traffic_share


def test_traffic_share_override_is_validated(monkeypatch):
    with pytest.raises(ConfigError, match="traffic_share sums to 0.7, not 1"):
        load_simulator(traffic_share={"feed": 0.5, "shops": 0.2})
    monkeypatch.setenv("GEM_SIMULATOR", "../simulator")
    with pytest.raises(ConfigError, match=r"GEM_SIMULATOR '\.\./simulator' must match"):
        load_simulator()


def test_make_eval_state_never_mixes_with_the_demo(monkeypatch, tmp_path):
    """`make eval` builds its world under $GEM_HOME/eval_world (lake, Dagster instance, models) and
    simulates it from simulator_eval.yaml, whatever DAGSTER_HOME the caller had."""
    from gem_model.store.paths import gem_home, lake_root
    from gem_pipelines.evaluate import use_eval_world

    monkeypatch.setenv("GEM_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("GEM_SIMULATOR", raising=False)
    home = use_eval_world()
    assert home == gem_home() == (tmp_path / "eval_world").resolve()
    assert lake_root() == str(home / "lake")
    assert Path(os.environ["DAGSTER_HOME"]) == home / "dagster"
    assert load_simulator().traffic_share is not None


class _FakeChild:
    def __init__(self, rc: int) -> None:
        self.rc, self.terminated = rc, False

    def poll(self) -> int | None:
        return None

    def wait(self) -> int:
        return self.rc

    def terminate(self) -> None:
        self.terminated = True


def test_distillation_arms_run_beside_in_the_callers_world(monkeypatch, tmp_path):
    """The second process starts from the environment before use_eval_world() (so its own
    use_eval_world() lands in $GEM_HOME/eval_world, not eval_world/eval_world), with half the cores."""
    import argparse
    import subprocess

    import torch

    from gem_pipelines import evaluate

    seen: dict = {}

    def popen(cmd, env, stdout, stderr):
        seen.update(cmd=cmd, env=env)
        return _FakeChild(0)

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    threads = torch.get_num_threads()
    try:
        args = argparse.Namespace(world="eval", preset="small", seeds=[0, 1, 2], arms=None)
        evaluate.start_distillation_beside(args, {"GEM_HOME": str(tmp_path)}, tmp_path / "d.log")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert seen["cmd"][1:] == ["-m", "gem_pipelines.evaluate", "--distillation-only", "--world", "eval",
                               "--preset", "small", "--seeds", "0", "1", "2"]
    assert seen["env"] == {"GEM_HOME": str(tmp_path), "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}
    try:  # a subset of the arms goes with it
        args = argparse.Namespace(world="eval", preset="small", seeds=[0], arms=["labels_only", "standard_kd"])
        evaluate.start_distillation_beside(args, {"GEM_HOME": str(tmp_path)}, tmp_path / "d.log")
    finally:
        torch.set_num_threads(threads)
    assert seen["cmd"][-4:] == ["0", "--arms", "labels_only", "standard_kd"]


def test_make_eval_trains_the_arms_it_is_given_and_refuses_an_unknown_one(monkeypatch, tmp_path):
    import gem_model.distill as distill
    import gem_pipelines.assets.students as students
    from gem_pipelines import evaluate

    calls: list = []
    monkeypatch.setattr(students, "accepted_teachers", lambda day=None: {"foundation": ("ckpt", "v")})
    monkeypatch.setattr(distill, "run_distillation", lambda arms, paths, seeds, **kw: calls.append(arms) or [])
    monkeypatch.setattr(distill, "write_report", lambda rows, path: path)
    monkeypatch.setattr(evaluate, "reports_dir", lambda: tmp_path / "reports")
    (tmp_path / "reports").mkdir()
    evaluate.main(["--distillation-only", "--world", "demo", "--seeds", "0", "--arms", "labels_only", "standard_kd"])
    evaluate.main(["--distillation-only", "--world", "demo", "--seeds", "0"])
    assert calls == [["labels_only", "standard_kd"], list(distill.ARMS)]
    with pytest.raises(SystemExit):
        evaluate.main(["--distillation-only", "--arms", "labels_only", "distill_harder"])


@pytest.mark.parametrize("failure", ["protocol", "arms"])
def test_make_eval_fails_loudly_when_either_half_fails(monkeypatch, tmp_path, failure):
    """A protocol that fails stops the arms beside it; arms that fail fail `make eval` (after the
    protocol's table), pointing at their log."""
    from gem_pipelines import evaluate

    monkeypatch.setenv("GEM_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))  # use_eval_world() rewrites these
    monkeypatch.delenv("GEM_SIMULATOR", raising=False)
    monkeypatch.delenv("GEM_DATA", raising=False)
    child = _FakeChild(1 if failure == "arms" else 0)
    envs: list[dict] = []

    def beside(args, env, log):
        envs.append(env)
        log.write_text("boom\n")
        return child

    class World:
        def data(self) -> None: ...

        def teacher(self, preset: str, seed: int) -> None: ...

    def protocol(*a) -> None:
        if failure == "protocol":
            raise RuntimeError("seed 1 diverged")

    monkeypatch.setattr(evaluate, "EvalWorld", World)
    monkeypatch.setattr(evaluate, "protocol", protocol)
    monkeypatch.setattr(evaluate, "start_distillation_beside", beside)
    (tmp_path / "reports").mkdir()
    monkeypatch.setattr(evaluate, "reports_dir", lambda: tmp_path / "reports")
    if failure == "protocol":
        with pytest.raises(RuntimeError, match="diverged"):
            evaluate.main(["--seeds", "0", "1"])
        assert child.terminated
    else:
        with pytest.raises(SystemExit, match="distillation arms failed"):
            evaluate.main(["--seeds", "0", "1"])
        assert not child.terminated
    assert envs[0]["GEM_HOME"] == str(tmp_path)  # the caller's, not the evaluation world's


V0, V1 = "20261205T094956Z-a20f81", "20261205T100235Z-e76959"  # foundation_model versions (<UTC time>-<run id>)


def test_rescoring_retrains_the_baselines_first_when_asked(monkeypatch, tmp_path):
    """`--rescore-versions ... --refit-baselines`: the LR and base rate again beside each version, in the seeds'
    order, then the table from every version; `--refit-baselines` alone is refused."""
    from gem_pipelines import evaluate

    monkeypatch.setenv("GEM_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("GEM_SIMULATOR", raising=False)
    monkeypatch.delenv("GEM_DATA", raising=False)
    calls: list[tuple] = []

    class World:
        def data(self) -> None: ...

    monkeypatch.setattr(evaluate, "EvalWorld", World)
    monkeypatch.setattr(evaluate, "run_lr_baselines",
                        lambda result, seeds: calls.append(("baselines", Path(result["version_dir"]).name, seeds)))
    monkeypatch.setattr(evaluate, "model_quality", lambda results, seeds: calls.append(("table", seeds)) or {})
    monkeypatch.setattr(evaluate, "quality_markdown", lambda *a: "table\n")
    (tmp_path / "reports").mkdir()
    monkeypatch.setattr(evaluate, "reports_dir", lambda: tmp_path / "reports")
    evaluate.main(["--seeds", "0", "1", "--rescore-versions", V0, V1, "--refit-baselines"])
    assert calls == [("baselines", V0, [0]), ("baselines", V1, [1]), ("table", [0, 1])]
    calls.clear()
    evaluate.main(["--seeds", "0", "1", "--rescore-versions", V0, V1])
    assert calls == [("table", [0, 1])]
    with pytest.raises(SystemExit):
        evaluate.main(["--refit-baselines"])
