"""Post-training knowledge transfer: foundation -> domain models -> per-surface
students, the distillation arms side by side, and the production students' serving export."""

from gem_model.distill.adapter import StudentAdapter
from gem_model.distill.arms import ARMS
from gem_model.distill.config import load_student_preset
from gem_model.distill.dataset import attach_teacher, load_examples
from gem_model.distill.domain import save_domain_model, train_domain_model
from gem_model.distill.export import export_student
from gem_model.distill.run import (
    DEFAULT_PATHS,
    kd_effectiveness,
    run_distillation,
    score_student,
    select_student,
    train_production_student,
    write_report,
)
from gem_model.distill.student import Student, student_config
from gem_model.distill.teacher import TEACHER_PREDICTIONS_SCHEMA, predict_teacher, write_teacher_predictions
from gem_model.distill.trainer import load_student, train_student

__all__ = [
    "DEFAULT_PATHS",
    "kd_effectiveness",
    "run_distillation",
    "save_domain_model",
    "score_student",
    "select_student",
    "train_production_student",
    "write_report",
    "ARMS",
    "TEACHER_PREDICTIONS_SCHEMA",
    "Student",
    "StudentAdapter",
    "attach_teacher",
    "export_student",
    "load_examples",
    "load_student",
    "load_student_preset",
    "predict_teacher",
    "student_config",
    "train_domain_model",
    "train_student",
    "write_teacher_predictions",
]
