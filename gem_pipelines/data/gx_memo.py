"""The one module that uses Great Expectations internals: GX's per-call rebuilds memoised while one suite runs
through GX's Validator (`validate`, `memoised()`). GX has no public API for either. Written against
great-expectations==1.24.1 (GX_VERSION, the pin in pyproject.toml); `RELIED_ON` lists every internal used
here with its parameters, and tests/data/test_validation.py::test_gx_internals_that_gx_memo_relies_on and
::test_gx_still_calls_what_gx_memo_wraps fail when an upgrade moves, reshapes or stops calling one of them.

What GX 1.x rebuilds on every call, and what it is inside the block (`bench/validation_cost.py` shows the costs):
- `Expectation.configuration`: a new `ExpectationConfiguration` (a pydantic `dict()`, a regex `camel_to_snake`
  of the class name, a new model) on every read, ~2,800 reads for the 37 expectations of `events` while the
  metric graph is built (a third of a suite's time whatever the rows). Inside: built on the first read for that
  expectation object (GX creates them by `to_domain_obj()` for the run and does not change them during it).
- `ExpectationConfiguration.to_domain_obj()`: a pydantic validation per metric of each expectation. Inside:
  built on the first call for that configuration object, again if its type or kwargs changed since.
- `IDDict.to_id()`: JSON + md5, twice per metric configuration. Inside: once per distinct kwargs (plain
  JSON-like values with the same types and reprs).
- The row-condition filter: `DataFrame.query` over the whole frame per metric of a conditional expectation
  (~13 ms a query on `events`). Inside: once per (frame, condition); metric functions read their domain only.
- The metric dependency graph of a list of expectations, identical for every partition of a table: kept per
  process (at most _GRAPHS_MAX), keyed by engine type, batch id, runtime configuration and the contents of
  every expectation configuration; used only inside the block.
Outside the block, and on any other thread, these are GX's own. One change holds everywhere, since its answer
is GX's own: `column_mean` tests every value in Python for `decimal.Decimal` (a sixth of the metric time of
`events` on 23k rows); an array whose dtype is not `object` cannot hold one.
tests/data/test_validation.py::test_memoised_gx_gives_the_results_of_plain_gx compares both ways.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

GX_VERSION = "1.24.1"
# (module, qualified name) -> parameter names, for every GX internal this module wraps or calls
RELIED_ON: dict[tuple[str, str], list[str]] = {
    ("great_expectations.expectations.expectation", "Expectation.configuration"): ["self"],
    ("great_expectations.execution_engine.pandas_execution_engine", "PandasExecutionEngine._apply_row_condition_filter"):
        ["self", "data", "row_condition", "domain_kwargs"],
    ("great_expectations.expectations.expectation_configuration", "ExpectationConfiguration.to_domain_obj"): ["self"],
    ("great_expectations.core.id_dict", "IDDict.to_id"): ["self", "id_keys", "id_ignore_keys"],
    ("great_expectations.util", "does_ndarray_contain_decimal_dtype"): ["data"],
    ("great_expectations.validator.validator",
     "Validator._generate_metric_dependency_subgraphs_for_each_expectation_configuration"):
        ["self", "expectation_configurations", "processed_configurations", "catch_exceptions", "runtime_configuration"],
    ("great_expectations.validator.v1_validator", "Validator.__init__"):
        ["self", "batch_definition", "result_format", "batch_parameters"],
    ("great_expectations.validator.v1_validator", "Validator.validate_expectation_suite"):
        ["self", "expectation_suite", "expectation_parameters"],
}
WRAPPED = frozenset(name for (module, name) in RELIED_ON if "v1_validator" not in module)
hits: collections.Counter[str] = collections.Counter()  # wrapped name -> calls that took the memoised branch

_state = threading.local()
_installed = False
_install_lock = threading.Lock()


def _install() -> None:
    """Wrap GX's property once per process; the wrapper defers to it unless memoising on this thread."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from great_expectations.expectations.expectation import Expectation

        original = Expectation.configuration.fget

        def configuration(self: Any) -> Any:
            if getattr(_state, "memo", None) is None:
                return original(self)
            return _memo("memo", "Expectation.configuration", id(self), self, None, lambda: original(self))

        Expectation.configuration = property(configuration, doc=Expectation.configuration.__doc__)

        from great_expectations.execution_engine.pandas_execution_engine import PandasExecutionEngine

        original_filter = PandasExecutionEngine._apply_row_condition_filter

        def _apply_row_condition_filter(self: Any, data: Any, row_condition: Any, domain_kwargs: dict) -> Any:
            if getattr(_state, "filters", None) is None:
                return original_filter(self, data, row_condition, domain_kwargs)
            key = (id(data), repr(row_condition), repr(domain_kwargs.get("condition_parser")))
            return _memo("filters", "PandasExecutionEngine._apply_row_condition_filter", key, data, None,
                         lambda: original_filter(self, data, row_condition, domain_kwargs))

        PandasExecutionEngine._apply_row_condition_filter = _apply_row_condition_filter

        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

        original_to_domain_obj = ExpectationConfiguration.to_domain_obj

        def to_domain_obj(self: Any) -> Any:
            if getattr(_state, "domain_objs", None) is None:
                return original_to_domain_obj(self)
            # GX adds batch_id to a copy's kwargs before building its expectation: rebuild if they changed
            return _memo("domain_objs", "ExpectationConfiguration.to_domain_obj", id(self), self,
                         (self.type, dict(self.kwargs)), lambda: original_to_domain_obj(self))

        ExpectationConfiguration.to_domain_obj = to_domain_obj

        from great_expectations.core.id_dict import IDDict

        original_to_id = IDDict.to_id

        def to_id(self: Any, id_keys: Any = None, id_ignore_keys: Any = None) -> Any:
            if (getattr(_state, "ids", None) is None or id_keys is not None or id_ignore_keys is not None
                    or type(self) is not IDDict or not _plain(self)):
                return original_to_id(self, id_keys, id_ignore_keys)
            # plain values with the same types and reprs serialise to the same JSON, hence the same id
            key = repr(sorted((str(k), repr(k), _typed(v)) for k, v in self.items()))
            return _memo("ids", "IDDict.to_id", key, None, None, lambda: original_to_id(self))

        IDDict.to_id = to_id

        import great_expectations.util as gx_util

        original_has_decimal = gx_util.does_ndarray_contain_decimal_dtype

        def does_ndarray_contain_decimal_dtype(data: Any) -> bool:
            # only an object array can hold decimal.Decimal values: the same answer without a Python loop
            hits["does_ndarray_contain_decimal_dtype"] += 1
            if getattr(getattr(data, "dtype", None), "kind", "O") != "O":
                return False
            return original_has_decimal(data)

        gx_util.does_ndarray_contain_decimal_dtype = does_ndarray_contain_decimal_dtype

        from great_expectations.validator.validator import Validator

        original_subgraphs = Validator._generate_metric_dependency_subgraphs_for_each_expectation_configuration

        def subgraphs(self: Any, expectation_configurations: list, processed_configurations: list,
                      catch_exceptions: bool, runtime_configuration: dict | None = None) -> Any:
            key = _graph_key(self, expectation_configurations, catch_exceptions, runtime_configuration)
            if key is None:
                return original_subgraphs(self, expectation_configurations, processed_configurations,
                                          catch_exceptions, runtime_configuration)
            hits["Validator._generate_metric_dependency_subgraphs_for_each_expectation_configuration"] += 1
            with _graphs_lock:
                hit = _graphs.get(key)
            if hit is None:
                graphs, evrs, processed = original_subgraphs(self, expectation_configurations, [],
                                                             catch_exceptions, runtime_configuration)
                hit = (list(graphs), list(evrs), list(processed))
                with _graphs_lock:
                    _graphs[key] = hit
                    while len(_graphs) > _GRAPHS_MAX:
                        _graphs.pop(next(iter(_graphs)))
            processed_configurations.extend(hit[2])  # GX's callers mutate these lists, never the cached ones
            return list(hit[0]), list(hit[1]), processed_configurations

        Validator._generate_metric_dependency_subgraphs_for_each_expectation_configuration = subgraphs
        _installed = True


def _memo(slot: str, name: str, key: Any, owner: Any, stamp: Any, build: Callable[[], Any]) -> Any:
    """`build()` once per `key` in this thread's memo `slot`, again when `stamp` changed. `owner` is kept in the
    memo, so its id (part of `key`) cannot be reused by another object while memoising."""
    hits[name] += 1
    memo = getattr(_state, slot)
    hit = memo.get(key)
    if hit is None or hit[0] is not owner or hit[1] != stamp:
        hit = memo[key] = (owner, stamp, build())
    return hit[2]


_PLAIN = (str, int, float, bool, type(None))
_graphs: dict[str, tuple[list, list, list]] = {}  # graph key -> (expectation graphs, evrs, configurations)
_graphs_lock = threading.Lock()
_GRAPHS_MAX = 64


def _graph_key(validator: Any, configurations: list, catch_exceptions: bool, runtime: dict | None) -> str | None:
    """What the metric graph of a list of expectations depends on: the engine type, the batch id, the runtime
    configuration and each configuration's content; None (not cached) outside `memoised()` or when a value is
    not plain JSON-like data."""
    if getattr(_state, "memo", None) is None:
        return None
    parts = [type(validator._execution_engine).__qualname__, validator.active_batch_id, catch_exceptions]
    if not _plain(runtime or {}):
        return None
    parts.append(_typed(runtime or {}))
    for c in configurations:
        fields = {"type": c.type, "kwargs": c.kwargs, "meta": c.meta, "notes": c.notes,
                  "description": c.description, "id": c.id, "severity": str(c.severity)}
        if not _plain(fields):
            return None
        parts.append(_typed(fields))
    return repr(parts)


def _plain(value: Any) -> bool:
    """JSON-like data only (a numpy array's repr elides values, so two different ones could share it)."""
    if isinstance(value, dict):
        return all(type(k) in _PLAIN and _plain(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    return type(value) in _PLAIN


def _typed(value: Any) -> Any:
    """`value` with the type of every element beside it, so that 1, 1.0 and True get different keys."""
    if isinstance(value, dict):
        return ("dict", sorted((repr(k), _typed(v)) for k, v in value.items()))
    if type(value) in (list, tuple):
        return (type(value).__name__, [_typed(v) for v in value])
    return (type(value).__name__, value)


@contextlib.contextmanager
def memoised() -> Iterator[None]:
    """Memoise what the module docstring lists (but the decimal test) on this thread during the block."""
    _install()
    names = ("memo", "filters", "domain_objs", "ids")
    outer = [getattr(_state, n, None) for n in names]
    if outer[0] is None:
        for n in names:
            setattr(_state, n, {})
    try:
        yield
    finally:
        for n, v in zip(names, outer, strict=True):
            setattr(_state, n, v)


def validate(suite: Any, batch_definition: Any, frame: Any, params: dict[str, Any], result_format: dict[str, Any]) -> Any:
    """`suite` on the pandas `frame`, memoised: GX's Validator on `batch_definition`, without the Checkpoint and
    ValidationDefinition around it (those re-serialise and compare the suite with a stored copy on every run,
    a third of a small partition's validation time). The public `Batch.validate` runs the same Validator
    but on a new uuid-named batch definition each call, whose batch id defeats the metric-graph memo (0.19 s
    instead of 0.15 s of CPU for a 300-row `events` partition)."""
    from great_expectations.validator.v1_validator import Validator

    validator = Validator(batch_definition, result_format=result_format, batch_parameters={"dataframe": frame})
    with memoised():
        return validator.validate_expectation_suite(suite, params)
