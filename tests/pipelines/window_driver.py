"""Drive a short window through the Dagster instance, as `make demo` does, against whatever lake
GEM_LAKE_URI names: ingest every (date, surface), training_examples, the teacher without baselines,
the domain models, teacher predictions and a two-arm distillation report (which reads every table).

Run as a script by tests/pipelines/test_s3_end_to_end.py (the calendar and surfaces come from
GEM_ASSETS_DIR, read at import, hence a fresh process)."""

from __future__ import annotations

from gem_pipelines.code_location import CodeLocation
from gem_pipelines.demo import _run
from gem_pipelines.instance import get_instance

REPORT_ARMS = {"arms": ["labels_only", "standard_kd"], "paths": ["direct"]}


def main() -> None:
    from gem_pipelines.partitions import CALENDAR, SURFACES, multi_key

    location = CodeLocation(get_instance())
    dates = [d.isoformat() for d in CALENDAR.dates()]
    for d in dates:
        for s in SURFACES.names:
            _run(location, "land_and_ingest_job", str(multi_key(d, s)))
    for d in dates:
        _run(location, "features_job", d)
    _run(location, "foundation_job", ops={"foundation_model": {"config": {"baselines": False}}})
    for domain in SURFACES.domains:
        _run(location, "domain_models_job", domain)
    for d in dates[1:]:
        _run(location, "teacher_predictions_job", d)
    _run(location, "distillation_report_job", ops={"distillation_report": {"config": REPORT_ARMS}})


if __name__ == "__main__":
    main()
