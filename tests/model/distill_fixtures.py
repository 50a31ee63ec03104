"""A tiny distillation world shared by the distill tests: a 5-day synthetic lake, an (untrained)
tiny foundation GEM, its teacher_predictions, and two domain models with theirs."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest
import torch

from gem_model.config import CalendarConfig, DayRoles
from gem_model.data.loader import date_range
from gem_model.data.synthetic import write_synthetic_lake
from gem_model.distill.domain import train_domain_model
from gem_model.distill.teacher import (
    FOUNDATION,
    domain_teacher,
    predict_teacher,
    read_teacher_predictions,
    write_teacher_predictions,
)
from gem_model.models import GEMConfig, build_model

START = dt.date(2026, 11, 1)
ROWS_PER_DAY = 2500
TINY_TEACHER = {"d_model": 32, "n_blocks": 1, "n_heads": 2, "wukong_hidden": 32, "head_hidden": 32, "summary_dim": 16}
TINY = {"train": {"max_steps": 40, "torch_threads": 1}, "domain": {"max_steps": 6}}


@dataclass
class World:
    lake: str
    te_uri: str
    tp_uri: str
    roles: DayRoles
    dates: list[dt.date]
    foundation: torch.nn.Module
    domains: dict[str, torch.nn.Module]

    @property
    def teachers(self) -> dict[str, torch.nn.Module]:
        return {FOUNDATION: self.foundation, **{domain_teacher(d): m for d, m in self.domains.items()}}


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("distill")
    lake = str(root / "lake")
    cal = CalendarConfig(start=START, days=5, teacher_lag_days=1)
    roles = cal.roles()
    dates = cal.dates()
    write_synthetic_lake(lake, dates, ROWS_PER_DAY, seed=3)
    te_uri, tp_uri = f"{lake}/training_examples", f"{lake}/teacher_predictions"
    torch.manual_seed(0)
    foundation = build_model(GEMConfig.from_specs(TINY_TEACHER)).eval()
    served = date_range(roles.student[0], roles.evaluation)
    write_teacher_predictions(predict_teacher(foundation, served, FOUNDATION, "f1", uri=te_uri), uri=tp_uri)
    domains = {}
    for domain in ("social", "commerce"):
        model, _ = train_domain_model(domain, foundation, dates=roles.student, preset="tiny", overrides=TINY,
                                      uri=te_uri, tp_uri=tp_uri)
        domains[domain] = model
        from gem_model.config import load_surfaces

        names = [s.name for s in load_surfaces().in_domain(domain)]
        df = predict_teacher(model, served, domain_teacher(domain), "d1", surfaces=names, uri=te_uri)
        write_teacher_predictions(df, uri=tp_uri)
    return World(lake, te_uri, tp_uri, roles, dates, foundation, domains)


def all_predictions(w: World):
    return read_teacher_predictions(uri=w.tp_uri)
