"""The built-in audit panel: sync points of common metrics, unpatched and patched.

Each :class:`Row` names a call (``update`` of one metric or of the five metrics of a
training step, or one torchmetrics helper) and builds it from scratch; :func:`run_panel`
audits every row twice, on the release's own code and with :func:`tmpatch.apply`, and
returns a :class:`Panel`. Metrics are built outside the simulation and, for the
patched run, after ``apply()`` (torchmetrics binds ``update`` at construction).
``compute`` is audited after one real ``update`` on the CPU.

Remaining sync points are labelled from :data:`LABELS` (matched on function name,
file and op), so a reader sees which syncs are inherent, opted into (input
validation) or removed by a tmpatch patch that is not in effect.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from tmpatch.audit.api import audit
from tmpatch.audit.report import AuditReport, SyncKind, SyncPoint

log = logging.getLogger("tmpatch")

# --- labels ------------------------------------------------------------------------------------
# Each patch carries the labels of the syncs it removes (``Patch.labels``, next to its targets);
# the ones below explain syncs no patch is about. First match wins: the patches' labels first.

from tmpatch import patches as catalogue  # noqa: E402
from tmpatch.spec import DEFERRED, INHERENT, UPSTREAM, VALIDATION, Label  # noqa: E402
from tmpatch.spec import PATCHED as PATCH  # noqa: E402

#: categories that ``--fail-on-sync`` tolerates in a patched update
TOLERATED = (INHERENT, VALIDATION)

GENERAL_LABELS: Tuple[Label, ...] = (
    Label(VALIDATION, "input validation (validate_args=True)",
          function=r"_\w*(validation|validate\w*|_check\w*)|_check_same_shape"),
    Label(INHERENT, "unbinned curve at compute: the distinct scores set the curve's length", function="_binary_clf_curve"),
    Label(INHERENT, "curve at compute: the release reads whether the target has positive and negative samples, "
          "to warn (compute's result is read anyway)",
          function=r"_\w*(roc|precision_recall_curve|auroc|average_precision)_compute", op="aten._local_scalar_dense"),
    Label(DEFERRED, "a patch's report (NaN seen, values out of range) moved from update to compute: one read",
          file="tmpatch/deferred.py"),
)

#: first match wins
LABELS: Tuple[Label, ...] = tuple(
    label for name in catalogue.NAMES for label in catalogue.load(name).labels
) + GENERAL_LABELS


def label_for(point: SyncPoint) -> Optional[Label]:
    """The first label of :data:`LABELS` matching ``point``, or None."""
    return next((label for label in LABELS if label.matches(point)), None)


# --- rows --------------------------------------------------------------------------------------

Call = Tuple[Any, tuple, dict]  # (metric or function, args, kwargs)


@dataclass(frozen=True)
class Row:
    """One panel row: ``build()`` returns the calls to audit, built fresh each time."""

    name: str
    build: Callable[[], List[Call]]
    requires: Tuple[str, ...]  #: ``module:attr`` names; a missing one makes the row n/a
    helper: bool = False  #: a function call, no ``compute``
    device: str = "cuda:0"
    deterministic: bool = False
    doc: str = ""


def _resolve(name: str) -> Any:
    module, _, attr = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _values(n: int = 8) -> torch.Tensor:
    return torch.randn(n, generator=_gen())


def _multiclass(classes: int, batch: int) -> Tuple[torch.Tensor, torch.Tensor]:
    g = _gen()
    return torch.randn(batch, classes, generator=g), torch.randint(0, classes, (batch,), generator=g)


def _regression() -> Tuple[torch.Tensor, torch.Tensor]:
    g = _gen()
    return torch.randn(8, generator=g), torch.randn(8, generator=g)


TM = "torchmetrics"
CLS = "torchmetrics.classification"
STEP_CLASSES = 1000
STEP_BATCH = 128


def training_step_calls() -> List[Call]:
    """The published case's metric work for one step: MeanMetric of the loss and multiclass
    Accuracy, Precision, Recall, F1 over 1000 classes (validate_args=False), one update each."""
    preds, target = _multiclass(STEP_CLASSES, STEP_BATCH)
    loss = torch.tensor(2.5)
    calls: List[Call] = [(_resolve(f"{TM}:MeanMetric")(), (loss,), {})]
    for name in ("MulticlassAccuracy", "MulticlassPrecision", "MulticlassRecall", "MulticlassF1Score"):
        metric = _resolve(f"{CLS}:{name}")(num_classes=STEP_CLASSES, validate_args=False)
        calls.append((metric, (preds, target), {}))
    return calls


def _mc_row(cls: str, validate: bool = False, suffix: str = "") -> Row:
    # batch 5: simulated ``torch.unique`` keeps every element, and validation wants <= num_classes of them.
    # Validation rows pass class labels: upstream validates nothing for float preds (an operator-precedence
    # slip makes its loop run over an empty tuple), so logits would hide the validation syncs.
    def inputs() -> Tuple[torch.Tensor, torch.Tensor]:
        preds, target = _multiclass(5, 5)
        return (preds.argmax(dim=1), target) if validate else (preds, target)

    return Row(cls + suffix, lambda: [(_resolve(f"{CLS}:{cls}")(num_classes=5, validate_args=validate),
                                       inputs(), {})], (f"{CLS}:{cls}",),
               doc=f"num_classes=5, validate_args={validate}" + (", integer preds" if validate else ""))


def _classification_inputs(task: str, samplewise: bool = False, ignore: Optional[int] = None,
                            labels: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Batch 6: multiclass logits (6, 5[, 3]) or labels (batch 5), binary (6,) / multilabel (6, 3) probabilities;
    every third target set to ``ignore`` when given."""
    g = _gen()
    if task == "multiclass":
        extra, batch = ((3,) if samplewise else ()), (5 if labels else 6)  # labels: see _mc_row
        preds = torch.randn(batch, 5, *extra, generator=g)
        target = torch.randint(0, 5, (batch, *extra), generator=g)
        if labels:
            preds = preds.argmax(dim=1)
    else:
        shape = (6,) if task == "binary" else (6, 3)
        preds, target = torch.rand(shape, generator=g), torch.randint(0, 2, shape, generator=g)
    if ignore is not None:
        target[::3] = ignore
    return preds, target


def _cls_row(cls: str, name: str = "", doc: str = "", inputs: Optional[Callable[[], tuple]] = None,
             **kwargs: Any) -> Row:
    """A row of ``torchmetrics.classification.<cls>(**kwargs)`` (validate_args=False unless given)."""
    task = "binary" if cls.startswith("Binary") else "multilabel" if cls.startswith("Multilabel") else "multiclass"
    kwargs.setdefault("validate_args", False)
    if task == "multiclass":
        kwargs.setdefault("num_classes", 5)
    elif task == "multilabel":
        kwargs.setdefault("num_labels", 3)
    if inputs is None:
        samplewise, ignore = kwargs.get("multidim_average") == "samplewise", kwargs.get("ignore_index")
        labels = bool(kwargs["validate_args"]) and task == "multiclass"  # see _mc_row

        def inputs() -> tuple:
            return _classification_inputs(task, samplewise, ignore, labels)

    shown = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k not in ("num_classes", "num_labels"))
    return Row(name or cls, lambda: [(_resolve(f"{CLS}:{cls}")(**kwargs), inputs(), {})], (f"{CLS}:{cls}",),
               doc=doc or shown)


def _multiclass_grid() -> Tuple[Row, ...]:
    """MulticlassStatScores over average x top_k x multidim_average x ignore_index: every update branch."""
    rows = []
    for ignore in (None, 0):
        for average in ("micro", "macro", "none"):
            for top_k in (1, 2):
                for multidim in ("global", "samplewise"):
                    name = f"MulticlassStatScores ({average}, top_k={top_k}, {multidim}" + \
                        (f", ignore_index={ignore})" if ignore is not None else ")")
                    rows.append(_cls_row("MulticlassStatScores", name, average=average, top_k=top_k,
                                         multidim_average=multidim, ignore_index=ignore))
    return tuple(rows)


_CLS_NAMES = ("Accuracy", "Precision", "Recall", "F1Score", "StatScores")


def _helper(name: str, target: str, args: Callable[[], tuple], kwargs: Optional[dict] = None,
            **options: Any) -> Row:
    return Row(name, lambda: [(_resolve(target), args(), dict(kwargs or {}))], (target,), helper=True, **options)


ROWS: Tuple[Row, ...] = (
    Row("MeanMetric (default weight)", lambda: [(_resolve(f"{TM}:MeanMetric")(), (_values(),), {})],
        (f"{TM}:MeanMetric",), doc="update(value)"),
    Row("MeanMetric (tensor weight)",
        lambda: [(_resolve(f"{TM}:MeanMetric")(), (_values(), torch.rand(8, generator=_gen())), {})],
        (f"{TM}:MeanMetric",), doc="update(value, weight)"),
    Row("MeanMetric (float value)", lambda: [(_resolve(f"{TM}:MeanMetric")(), (3.5,), {})],
        (f"{TM}:MeanMetric",), doc="update(3.5)"),
    Row("SumMetric", lambda: [(_resolve(f"{TM}:SumMetric")(), (_values(),), {})], (f"{TM}:SumMetric",)),
    Row("MaxMetric", lambda: [(_resolve(f"{TM}:MaxMetric")(), (_values(),), {})], (f"{TM}:MaxMetric",)),
    Row("MinMetric", lambda: [(_resolve(f"{TM}:MinMetric")(), (_values(),), {})], (f"{TM}:MinMetric",)),
    Row("CatMetric", lambda: [(_resolve(f"{TM}:CatMetric")(), (_values(),), {})], (f"{TM}:CatMetric",)),
    Row("RunningMean", lambda: [(_resolve(f"{TM}:RunningMean")(window=3), (_values(),), {})],
        (f"{TM}:RunningMean",), doc="window=3"),
    _mc_row("MulticlassAccuracy"),
    _mc_row("MulticlassPrecision"),
    _mc_row("MulticlassRecall"),
    _mc_row("MulticlassF1Score"),
    *(_cls_row(f"Multiclass{n}", f"Multiclass{n} (ignore_index)", ignore_index=0)
      for n in ("Accuracy", "Precision", "Recall", "F1Score")),
    *_multiclass_grid(),
    *(_cls_row(f"{task}{n}") for task in ("Binary", "Multilabel") for n in _CLS_NAMES),
    *(_cls_row(f"{task}ConfusionMatrix") for task in ("Binary", "Multiclass", "Multilabel")),
    _cls_row("BinaryConfusionMatrix", "BinaryConfusionMatrix (ignore_index)", ignore_index=-1),
    _cls_row("MulticlassConfusionMatrix", "MulticlassConfusionMatrix (ignore_index)", ignore_index=0),
    *(_cls_row(f"{task}PrecisionRecallCurve", f"{task}PrecisionRecallCurve (thresholds=10)", thresholds=10)
      for task in ("Binary", "Multiclass", "Multilabel")),
    _cls_row("BinaryAUROC", "BinaryAUROC (thresholds=10)", thresholds=10),
    _cls_row("BinaryPrecisionRecallCurve", "BinaryPrecisionRecallCurve (thresholds=10, ignore_index)",
             thresholds=10, ignore_index=-1),
    _cls_row("MulticlassPrecisionRecallCurve", "MulticlassPrecisionRecallCurve (thresholds=10, ignore_index)",
             thresholds=10, ignore_index=0),
    _cls_row("BinaryCalibrationError"),
    _cls_row("MulticlassCalibrationError"),
    _cls_row("BinaryPrecisionRecallCurve", "BinaryPrecisionRecallCurve (thresholds=None)", thresholds=None),
    _cls_row("BinaryAUROC", "BinaryAUROC (thresholds=None, ignore_index)", thresholds=None, ignore_index=-1),
    _mc_row("MulticlassAccuracy", validate=True, suffix=" (validate_args)"),
    _cls_row("MulticlassAccuracy", "MulticlassAccuracy (validate_args, ignore_index)", validate_args=True,
             ignore_index=0),
    _cls_row("BinaryAccuracy", "BinaryAccuracy (validate_args)", validate_args=True),
    _cls_row("MultilabelAccuracy", "MultilabelAccuracy (validate_args)", validate_args=True),
    Row("MeanSquaredError", lambda: [(_resolve(f"{TM}:MeanSquaredError")(), _regression(), {})],
        (f"{TM}:MeanSquaredError",)),
    Row("MeanAbsoluteError", lambda: [(_resolve(f"{TM}:MeanAbsoluteError")(), _regression(), {})],
        (f"{TM}:MeanAbsoluteError",)),
    _helper("_safe_divide", "torchmetrics.utilities.compute:_safe_divide",
            lambda: (_values(4), torch.rand(4, generator=_gen())), device="cuda:1", doc="on cuda:1"),
    _helper("_cumsum", "torchmetrics.utilities.data:_cumsum", lambda: (_values(),), {"dim": 0},
            device="cuda:1", deterministic=True, doc="deterministic mode, on cuda:1"),
    Row("training step", training_step_calls,
        (f"{TM}:MeanMetric",) + tuple(f"{CLS}:{n}" for n in ("MulticlassAccuracy", "MulticlassPrecision",
                                                             "MulticlassRecall", "MulticlassF1Score")),
        doc=f"MeanMetric(loss) + multiclass Accuracy, Precision, Recall, F1 ({STEP_CLASSES} classes, "
            f"batch {STEP_BATCH}), one update each"),
)

ROW_NAMES: Tuple[str, ...] = tuple(row.name for row in ROWS)


def find_row(name: str) -> Row:
    """The row called ``name`` (case-insensitive); ``KeyError`` if none."""
    for row in ROWS:
        if row.name.lower() == name.lower():
            return row
    raise KeyError(name)


# --- results -----------------------------------------------------------------------------------

@dataclass
class Audited:
    """The points of one call of one row in one mode (None report: not applicable)."""

    report: Optional[AuditReport]
    patched: bool

    @property
    def count(self) -> Optional[int]:
        """Number of syncs (non-syncs not counted)."""
        return None if self.report is None else self.report.count

    @property
    def points(self) -> List[SyncPoint]:
        """Syncs, then non-syncs (device mismatches, pinned copies)."""
        return [] if self.report is None else self.report.points

    def labels(self) -> List[Optional[Label]]:
        """One label (or None) per point of :attr:`points`."""
        return [label_for(p) for p in self.points]

    def untolerated(self) -> List[SyncPoint]:
        """Sync points not labelled inherent or validation (non-syncs never count)."""
        return [p for p, lab in zip(self.points, self.labels())
                if p.is_sync and (lab is None or lab.category not in TOLERATED)]

    def to_dict(self) -> Optional[Dict[str, Any]]:
        if self.report is None:
            return None
        data = self.report.to_dict()
        for key in ("sync_points", "non_syncs"):
            for point in data[key]:
                label = label_for(SyncPoint(SyncKind(point["kind"]), point["op"], point["location"],
                                            point["function"], point["detail"]))
                point["label"] = None if label is None else {"category": label.category, "reason": label.reason}
        return data


@dataclass
class RowResult:
    """One row audited: ``update``/``compute``, unpatched and patched; ``available`` False = n/a."""

    name: str
    available: bool
    doc: str = ""
    why_na: str = ""
    helper: bool = False
    error: str = ""  #: the audit raised (text); the row's figures are incomplete
    update: Dict[str, Audited] = field(default_factory=dict)  #: "unpatched"/"patched"
    compute: Dict[str, Audited] = field(default_factory=dict)

    def notes(self) -> List[str]:
        """The distinct reasons of the patched syncs (update and compute), in order."""
        if not self.available:
            return [self.why_na]
        reasons: List[str] = [f"error: {self.error}"] if self.error else []
        for audited in (self.update.get("patched"), self.compute.get("patched")):
            if audited is None:
                continue
            for point, label in zip(audited.points, audited.labels()):
                unexplained = "unexplained sync" if point.is_sync else f"{point.kind.value} (not a sync)"
                text = unexplained if label is None else f"{label.category}: {label.reason}"
                if text not in reasons:
                    reasons.append(text)
            if audited.report is not None and not audited.report.complete:
                reasons.append("audit stopped early")
        return reasons

    def note(self) -> str:
        """:meth:`notes`, ``;``-joined."""
        return "; ".join(self.notes())

    def fixed_by(self) -> List[str]:
        """The tmpatch patches named by the labels of unpatched syncs that are gone patched."""
        names: List[str] = []
        for part in (self.update, self.compute):
            if "unpatched" not in part or "patched" not in part:
                continue
            remaining = {(p.kind, p.function) for p in part["patched"].points}
            for point, label in zip(part["unpatched"].points, part["unpatched"].labels()):
                if label is not None and label.patch and (point.kind, point.function) not in remaining \
                        and label.patch not in names:
                    names.append(label.patch)
        return names

    def fails(self) -> bool:
        """Whether the patched ``update`` keeps a sync that is neither inherent nor validation
        (or could not be audited)."""
        if not self.available:
            return False
        patched = self.update.get("patched")
        return bool(self.error) or patched is None or bool(patched.untolerated())

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name, "available": self.available, "doc": self.doc, "why_na": self.why_na,
            "error": self.error or None,
            "update": {mode: a.to_dict() for mode, a in self.update.items()},
            "compute": {mode: a.to_dict() for mode, a in self.compute.items()},
            "notes": self.notes(), "fixed_by": self.fixed_by(), "fails": self.fails(),
        }


@dataclass
class Panel:
    """The whole panel: the torchmetrics release, the patch states and one result per row."""

    release: str
    mode: str
    patch_states: Dict[str, str]
    rows: List[RowResult]

    def __getitem__(self, name: str) -> RowResult:
        for row in self.rows:
            if row.name.lower() == name.lower():
                return row
        raise KeyError(name)

    def failing(self) -> List[RowResult]:
        """Rows whose patched update still syncs for a reason not tolerated (see :data:`TOLERATED`)."""
        return [row for row in self.rows if row.fails()]

    def to_dict(self) -> Dict[str, Any]:
        return {"torchmetrics": self.release, "mode": self.mode, "patches": self.patch_states,
                "rows": [row.to_dict() for row in self.rows]}


# --- running -----------------------------------------------------------------------------------

def _update_all(calls: List[Call]) -> None:
    for target, args, kwargs in calls:
        (target.update if isinstance(target, torch.nn.Module) else target)(*args, **kwargs)


def _compute_all(metrics: List[Any]) -> List[Any]:
    return [metric.compute() for metric in metrics]


@contextlib.contextmanager
def _deterministic(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*deterministic mode.*")
            yield
    finally:
        torch.use_deterministic_algorithms(previous)


def _audit_row(row: Row, patched: bool, real: Optional[bool]) -> Tuple[Audited, Optional[Audited]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics' own warnings (compute before update, ...)
        calls = row.build()
        with _deterministic(row.deterministic):
            if row.helper:
                target, args, kwargs = calls[0]
                return Audited(audit(target, *args, device=row.device, real=real, **kwargs), patched), None
            update = audit(_update_all, calls, device=row.device, real=real)
            for metric, args, kwargs in calls:  # one real update on the CPU, then compute on the device
                metric.update(*args, **kwargs)
            compute = audit(_compute_all, [metric for metric, _, _ in calls], device=row.device, real=real)
    return Audited(update, patched), Audited(compute, patched)


def _available(row: Row) -> Tuple[bool, str]:
    for name in row.requires:
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            return False, f"n/a: {name.replace(':', '.')} not in this release"
    return True, ""


def _active_patches() -> List[str]:
    import tmpatch
    from tmpatch.report import State

    idle = (State.OFF, State.EXCLUDED, State.REVERTED)  # every other state: requested by apply()
    return [row.name for row in tmpatch.status() if row.state not in idle]


@contextlib.contextmanager
def restored_patches() -> Iterator[None]:
    """Run the block, then put tmpatch back as it was: reverted, or the patches that were
    requested (applied, pending, not needed, ...) applied again."""
    import tmpatch

    active = _active_patches()
    try:
        yield
    finally:
        tmpatch.revert()
        if active:
            tmpatch.apply(active)


def run_panel(names: Optional[Sequence[str]] = None, real: Optional[bool] = None) -> Panel:
    """Audit the rows named (default: all; in panel order), unpatched then patched; tmpatch is
    left as found. ``KeyError`` for an unknown name.

    ``real``: see :func:`tmpatch.audit.audit` (None: a GPU when there is one).
    """
    import torchmetrics

    import tmpatch
    from tmpatch.audit.api import _use_real

    wanted = None if names is None else {find_row(n).name for n in names}
    rows = [row for row in ROWS if wanted is None or row.name in wanted]  # panel order
    results = []
    for row in rows:
        ok, why = _available(row)
        results.append(RowResult(row.name, ok, row.doc, why, row.helper))
    with restored_patches():
        states: Dict[str, str] = {}
        for mode in ("unpatched", "patched"):
            if mode == "patched":
                states = tmpatch.apply().states()
            else:
                tmpatch.revert()
            for row, result in zip(rows, results):
                if not result.available:
                    continue
                log.debug("tmpatch.audit: panel row %s, %s", row.name, mode)
                try:
                    update, compute = _audit_row(row, mode == "patched", real)
                except Exception as exc:  # noqa: BLE001 - one broken row must not hide the others
                    if mode == "unpatched":  # the release itself cannot run the call (an upstream bug)
                        result.available = False
                        result.why_na = f"n/a: torchmetrics {torchmetrics.__version__} raises {type(exc).__name__}: {exc}"
                        log.info("tmpatch.audit: panel row %s: %s", row.name, result.why_na)
                        continue
                    log.warning("tmpatch.audit: panel row %s (%s) failed: %r", row.name, mode, exc)
                    result.error = f"{mode}: {type(exc).__name__}: {exc}"
                    continue
                result.update[mode] = update
                if compute is not None:
                    result.compute[mode] = compute
    return Panel(torchmetrics.__version__, "real" if _use_real(real) else "simulated", states, results)
