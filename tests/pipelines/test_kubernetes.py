"""The Kubernetes tags of the code location, parsed by dagster-k8s 0.29.27 (the release of Dagster 1.13.27)
exactly as its k8s_job_executor does, then built into the pod spec it would submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster_k8s import k8s_job_executor
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

from gem_pipelines.definitions import defs
from gem_pipelines.instance import POOL_LIMITS
from gem_pipelines.k8s import GPU_POOL, TAG, executor_for, gpu_step_tags, load_kubernetes

TRAINING = {"foundation_model", "foundation_refresh", "domain_models", "teacher_predictions", "distillation_report",
            "students"}


def _pod_spec(tags: dict[str, str]):
    """The V1PodSpec dagster-k8s builds for a step with these (string) tags."""
    user = get_user_defined_k8s_config(tags)
    job = construct_dagster_k8s_job(
        DagsterK8sJobConfig(job_image="gem:test", dagster_home="/opt/dagster/dagster_home"),
        args=["dagster", "api", "execute_step"], job_name="dagster-step-test", user_defined_k8s_config=user,
    )
    return job.spec.template.spec


def _as_step_tags(tags: dict[str, object]) -> dict[str, str]:
    """Dagster stores non-string tag values as JSON, which is what the executor reads back."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in tags.items()}


def _steps_with_tags() -> dict[str, dict[str, str]]:
    """op name -> tags of every node of every job in the code location."""
    out = {}
    for job in defs.resolve_all_job_defs():
        assert get_user_defined_k8s_config(dict(job.tags)) is not None  # run tags parse too
        for node in job.graph.nodes:
            out[node.name] = dict(node.tags)
    return out


def test_training_steps_ask_for_gpus_on_the_gpu_pool() -> None:
    cfg = load_kubernetes()
    steps = _steps_with_tags()
    assert TRAINING <= set(steps)
    tagged = {name for name, tags in steps.items() if TAG in tags}
    assert tagged == TRAINING  # ingest and features stay on CPU nodes
    for name in TRAINING:
        spec = _pod_spec(steps[name])
        resources = spec.containers[0].resources
        assert resources.limits[cfg.gpu_resource] == resources.requests[cfg.gpu_resource] == "1", name
        assert spec.node_selector == cfg.node_selector
        assert [t.to_dict() for t in spec.tolerations] == [
            {"key": t["key"], "operator": t["operator"], "effect": t["effect"], "value": None,
             "toleration_seconds": None} for t in cfg.tolerations
        ]


def test_training_assets_share_the_gpu_pool() -> None:
    pools = {}
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        pools[key.to_user_string()] = defs.resolve_assets_def(key).node_def.pool
    assert {a for a, p in pools.items() if p == GPU_POOL} == TRAINING
    assert POOL_LIMITS[GPU_POOL] == 1


def test_gpu_count_reaches_the_pod_spec() -> None:
    spec = _pod_spec(_as_step_tags(gpu_step_tags(8)))
    assert spec.containers[0].resources.limits[load_kubernetes().gpu_resource] == "8"
    with pytest.raises(ValueError, match="at least one GPU, got 0"):
        gpu_step_tags(0)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.update(container_confg=t.pop("container_config")),  # unknown section
        lambda t: t["container_config"]["resources"].update(limts=t["container_config"]["resources"].pop("limits")),
        lambda t: t["pod_spec_config"].update(node_selectr=t["pod_spec_config"].pop("node_selector")),
    ],
    ids=["section", "resources-key", "pod-spec-key"],
)
def test_a_typo_in_the_tags_fails(mutate) -> None:
    """The same parsing rejects a misspelt key, so the test above cannot pass on a silently ignored tag."""
    tags = gpu_step_tags(1)
    mutate(tags[TAG])
    with pytest.raises(Exception, match="container_confg|limts|node_selectr"):
        _pod_spec(_as_step_tags(tags))


def test_k8s_executor_and_teacher_gpus_come_from_env() -> None:
    assert executor_for("default") is None
    assert executor_for("k8s") is k8s_job_executor
    with pytest.raises(ValueError, match="GEM_EXECUTOR"):
        executor_for("kubernetes")
    # the code location itself, loaded as the cluster loads it (GEM_NPROC: the teacher's GPUs)
    probe = ("import json; from gem_pipelines.definitions import defs; job = defs.resolve_job_def('foundation_job'); "
             "print(json.dumps([job.executor_def.name, dict(job.graph.node_dict['foundation_model'].tags)]))")
    env = {**os.environ, "GEM_EXECUTOR": "k8s", "GEM_NPROC": "8", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    executor, tags = json.loads(out.stdout.strip().splitlines()[-1])
    assert executor == k8s_job_executor.name
    assert _pod_spec(tags).containers[0].resources.limits[load_kubernetes().gpu_resource] == "8"
