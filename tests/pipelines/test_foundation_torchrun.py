"""`foundation_model` with nproc_per_node=2: torchrun (2 gloo ranks on CPU) launched through Dagster Pipes,
the same run_foundation arguments as the in-process path (seeds, baselines, compile, warm start), progress
and the result streamed back as Pipes messages from rank 0 alone. And the training steps' retries, on either
launcher (assets/retries.yaml)."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import dagster as dg
import pytest
import yaml

from gem_model.config import ASSETS_DIR, load_calendar, load_surfaces
from gem_model.data.synthetic import write_synthetic_lake
from gem_model.models.registry import list_versions
from gem_model.train import config as train_config
from gem_model.train.config import load_preset, resolve_config
from gem_pipelines.assets import foundation as foundation_module
from gem_pipelines.assets.foundation import ASSET, FoundationConfig, foundation_model, launch_args
from gem_pipelines.resources import AcceleratorResource, LakeResource, WandbResource
from gem_pipelines.settings import ModelGate, QualityConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _window_lake(home) -> str:
    """The calendar's whole window as a small synthetic lake (training_examples + oracle)."""
    cal = load_calendar()
    days = [cal.start + dt.timedelta(days=i) for i in range(int(cal.days))]
    lake = home / "lake"
    write_synthetic_lake(str(lake), days, 700, seed=11)
    return str(lake)


def _materialize(instance, lake: str, nproc: int, **config) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [foundation_model],
        instance=instance,
        resources={
            "lake": LakeResource(root=lake),
            "accelerator": AcceleratorResource(device="cpu", nproc_per_node=nproc),
            "wandb": WandbResource(mode="disabled"),
            "pipes": dg.PipesSubprocessClient(env={"OMP_NUM_THREADS": "1"}),
        },
        run_config=dg.RunConfig({ASSET: FoundationConfig(**{"preset": "tiny", **config})}),
    )


def test_launch_args_are_the_config_verbatim(gem_home):
    """Both launchers receive these: nothing of the config is dropped on the torchrun path."""
    args = launch_args(FoundationConfig(preset="tiny", seeds=[3, 4], baselines=False),
                       AcceleratorResource(device="cpu", nproc_per_node=2, compile=True, embedding_sharding="row"), "/lake", None, "v")
    assert args == {"preset": "tiny", "seeds": [3, 4], "baselines": False, "device": "cpu", "init_from": None,
                    "lake": "/lake", "overrides": {"train": {"compile": True, "precision": "fp32", "embedding_sharding": "row"}},
                    "version": "v", "resume": False}
    assert launch_args(FoundationConfig(preset="tiny"), AcceleratorResource(device="cpu"), None, None, "v", True)["resume"]


def test_the_resource_overrides_only_what_it_sets(gem_home):
    """An accelerator left at its defaults keeps the preset's compile and sharding (base and large compile); the
    resource's own values win over every preset."""
    def train(preset: str, accelerator: AcceleratorResource) -> dict:
        config = {"preset": preset, "data": {"train": ["2026-11-01", "2026-11-02"]},
                  "train": accelerator.train_overrides()}
        return resolve_config(config)["train"]

    assert load_preset("large")["train"]["compile"] is True
    kept = train("large", AcceleratorResource(device="cpu"))
    assert kept["compile"] is True and kept["embedding_sharding"] == "replicated" and kept["precision"] == "fp32"
    chosen = train("large", AcceleratorResource(device="cpu", compile=False, embedding_sharding="row"))
    assert chosen["compile"] is False and chosen["embedding_sharding"] == "row"
    with pytest.raises(ValueError, match="embedding_sharding"):
        train("tiny", AcceleratorResource(device="cpu", embedding_sharding="rows"))


def test_foundation_asset_two_gloo_ranks_through_pipes(gem_home, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    # the gate has its own tests; a tiny model on a tiny window only has to be sane (as in conftest.small_assets)
    monkeypatch.setattr(foundation_module, "QUALITY",
                        QualityConfig(model_gate=ModelGate(min_positives=5, max_ne=2.0, max_regression=1.0)))
    lake = _window_lake(gem_home)
    surfaces = load_surfaces().names
    models = gem_home / "models"
    with dg.DagsterInstance.ephemeral() as instance:
        # in process (world size 1), teacher only: it becomes the ACCEPTED version to warm-start from
        first = _materialize(instance, lake, 1, seeds=[1], baselines=False, warm_start=False)
        assert first.success
        accepted = (models / ASSET / "ACCEPTED").read_text().strip()

        second = _materialize(instance, lake, 2, seeds=[1], baselines=True, warm_start=True)
        assert second.success
        meta = second.asset_materializations_for_node(ASSET)[0].metadata
        version = meta["version"].value
        assert meta["world_size"].value == 2 and meta["warm_started_from"].value == accepted
        assert meta["pipes_progress_messages"].value > 0
        logs = [e.message for e in instance.all_logs(second.run_id) if e.message]

    # launched with exactly the arguments the in-process path would get
    launch = json.loads((models / ASSET / version / "launch.json").read_text())
    assert launch["seeds"] == [1] and launch["baselines"] is True and launch["version"] == version
    # the resource sets the precision alone: compile and sharding stay the preset's
    assert launch["init_from"].endswith(accepted) and launch["overrides"] == {"train": {"precision": "fp32"}}

    # the teacher trained on 2 ranks, with seed 1, warm-started from the accepted version
    teacher = json.loads((models / ASSET / version / "metrics.json").read_text())
    assert teacher["world_size"] == 2 and teacher["config"]["seed"] == 1
    assert teacher["warm_start"]["loaded"] > 0 and teacher["warm_start"]["skipped"] == 0
    # ... and the baselines too, one per surface
    for s in surfaces:
        base = json.loads((models / "single_surface_baseline" / s / version / "metrics.json").read_text())
        assert base["world_size"] == 2 and base["config"]["seed"] == 1 and base["config"]["data"]["surfaces"] == [s]

    # metrics came back through Pipes: the rows of the report and the progress log lines (rank 0 only)
    report = json.loads((gem_home / "reports" / "foundation_eval.json").read_text())["rows"]
    assert {(r["model"], r["surface"]) for r in report if r["task"] == "click"} == {
        (m, s) for m in ("foundation", "single_surface") for s in surfaces
    }
    assert all(r["seed"] == 1 for r in report)
    steps = [m for m in logs if m.startswith("[foundation-s1] step") and "train/loss" in m]
    assert steps and len(steps) == len(set(steps)), logs  # streamed, and once: not once per rank
    assert teacher["loss_curve"] and len(steps) == len(teacher["loss_curve"])


@pytest.mark.parametrize("nproc", [1, 2], ids=["in_process", "torchrun"])
def test_a_step_that_fails_in_training_is_retried_and_resumes_its_version(gem_home, monkeypatch, tmp_path, nproc):
    """The teacher fails right after its step-2 checkpoint (in process: an exception; under torchrun: both ranks
    raise, the launcher exits non-zero): Dagster retries the step in the same run (assets/retries.yaml) and the
    retry continues that version from step 2. One run, one version, a success."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(foundation_module, "QUALITY",
                        QualityConfig(model_gate=ModelGate(min_positives=5, max_ne=2.0, max_regression=1.0)))
    preset = load_preset("tiny")
    preset["train"].update(checkpoint_every=1, fail_at_step=2)
    # a preset is a name of assets/models/: a copy of assets/ with one more preset, for this process and torchrun's
    assets = tmp_path / "assets"
    shutil.copytree(ASSETS_DIR, assets)
    (assets / "models" / "tiny_failing.yaml").write_text(yaml.safe_dump(preset))
    monkeypatch.setenv("GEM_ASSETS_DIR", str(assets))
    monkeypatch.setattr(train_config, "ASSETS_DIR", assets)
    lake = _window_lake(gem_home)
    with dg.DagsterInstance.ephemeral() as instance:
        result = _materialize(instance, lake, nproc, preset="tiny_failing", seeds=[1], baselines=False,
                              warm_start=False)
        events = [e.dagster_event.event_type for e in instance.all_logs(result.run_id) if e.dagster_event]
    assert result.success
    assert events.count(dg.DagsterEventType.STEP_FAILURE) == 0
    assert events.count(dg.DagsterEventType.STEP_UP_FOR_RETRY) == 1
    assert events.count(dg.DagsterEventType.STEP_RESTARTED) == 1
    meta = result.asset_materializations_for_node(ASSET)[0].metadata
    version = meta["version"].value
    assert list_versions(ASSET) == [version]  # the retry did not start another
    assert meta["resumed_from_step"].value == 2
    teacher = json.loads((gem_home / "models" / ASSET / version / "metrics.json").read_text())
    assert teacher["resumed_from_step"] == 2 and teacher["step"] > 2
    assert (gem_home / "models" / ASSET / version / "gate.json").is_file()


def test_a_failure_no_retry_would_change_is_not_retried(gem_home):
    """foundation_refresh with no ACCEPTED foundation to continue fails at once, saying what is missing."""
    from gem_pipelines.assets.refresh import foundation_refresh

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize([foundation_refresh], instance=instance, partition_key=load_calendar().roles().evaluation.isoformat(),
                                resources={"lake": LakeResource(root=str(gem_home / "lake")),
                                           "accelerator": AcceleratorResource(device="cpu"),
                                           "wandb": WandbResource(mode="disabled")},
                                raise_on_error=False)
        events = [e.dagster_event for e in instance.all_logs(result.run_id) if e.dagster_event]
    assert not result.success
    assert [e.event_type for e in events].count(dg.DagsterEventType.STEP_UP_FOR_RETRY) == 0
    (failure,) = [e for e in events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert "no ACCEPTED foundation_model version" in failure.step_failure_data.error.message
