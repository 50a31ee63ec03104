"""Distillation arms: config switches over one student architecture and one dataset.

The arms are cumulative: (c) aux_head, (d) = (c) + Student Adapter,
(e) = (d) + representation transfer, (f) = (e) + parameter sharing.

    kd:             none | single (standard KD on the serving head) | aux (separate distillation head)
    adapter:        the distillation target is the Student Adapter's output, fitted on E-2 alone
    representation: the teacher's summary embedding (from teacher_predictions) is a student input
    share_tables:   the student's embedding tables named in students.yaml train.share_tables are
                    initialised from the teacher's tables (the domain model's on the hierarchical path)
"""

from __future__ import annotations

from typing import Any

ARMS: dict[str, dict[str, Any]] = {
    "labels_only": {"kd": "none", "adapter": False, "representation": False, "share_tables": False},
    "standard_kd": {"kd": "single", "adapter": False, "representation": False, "share_tables": False},
    "aux_head": {"kd": "aux", "adapter": False, "representation": False, "share_tables": False},
    "student_adapter": {"kd": "aux", "adapter": True, "representation": False, "share_tables": False},
    "representation": {"kd": "aux", "adapter": True, "representation": True, "share_tables": False},
    "parameter_sharing": {"kd": "aux", "adapter": True, "representation": True, "share_tables": True},
}
PATHS = ("direct", "hierarchical", "none")
BASELINE, STANDARD = "labels_only", "standard_kd"


def arm_spec(arm: str) -> dict[str, Any]:
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; known: {list(ARMS)}")
    return dict(ARMS[arm])


def arm_paths(arm: str, paths: list[str] | tuple[str, ...]) -> list[str]:
    """The paths an arm runs on: labels_only only on `none`; the others on every teacher path."""
    if arm == BASELINE:
        return ["none"]
    out = [p for p in paths if p != "none"]
    for p in out:
        if p not in PATHS:
            raise ValueError(f"unknown path {p!r}; known: {PATHS}")
    return out
