"""Kubernetes placement of the training steps, from assets/kubernetes.yaml.

Under dagster-k8s's `k8s_job_executor` (GEM_EXECUTOR=k8s) every step is its own pod and takes its
`dagster-k8s/config` op tags: GPU steps ask for `nvidia.com/gpu` and land on the GPU node pool, the
rest (ingest, features) stay on CPU nodes. Elsewhere the tags are inert. The `gpu` concurrency pool
caps training steps at one per GPU (see gem_pipelines/instance.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gem_model.config import ASSETS_DIR, _load, _Strict, env

TAG = "dagster-k8s/config"
GPU_POOL = "gpu"


class KubernetesConfig(_Strict):
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, str]] = Field(default_factory=list)


def load_kubernetes(path: Path | None = None) -> KubernetesConfig:
    return _load(KubernetesConfig, path or ASSETS_DIR / "kubernetes.yaml")


def gpu_step_tags(gpus: int = 1) -> dict[str, object]:
    """Op tags of a step that needs `gpus` GPUs of one node (limits = requests: GPUs are not overcommitted)."""
    if gpus < 1:
        raise ValueError(f"a GPU step needs at least one GPU, got {gpus}")
    cfg = load_kubernetes()
    gpu = {cfg.gpu_resource: str(gpus)}
    pod_spec = cfg.model_dump(include={"node_selector", "tolerations"}, exclude_defaults=True)  # the ones set
    config: dict[str, object] = {"container_config": {"resources": {"limits": gpu, "requests": dict(gpu)}}}
    return {TAG: config | ({"pod_spec_config": pod_spec} if pod_spec else {})}


def training_gpus() -> int:
    """GPUs of the foundation step: its torchrun world on one node (GEM_NPROC, as the prod accelerator)."""
    return int(env("GEM_NPROC") or 1)


def executor_for(name: str | None = None):
    """The executor of every job: Dagster's default, or `k8s` for one pod per step (GEM_EXECUTOR)."""
    name = name or env("GEM_EXECUTOR")
    if name == "default":
        return None
    if name == "k8s":
        from dagster_k8s import k8s_job_executor  # the `k8s` extra: only the cluster image needs it

        return k8s_job_executor
    raise ValueError(f"GEM_EXECUTOR must be default or k8s, got {name!r}")
