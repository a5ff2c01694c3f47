"""deferred_reports: where the reports that patches move out of ``update()`` are given.

Not a defect of torchmetrics: the rules that let ``nan_check`` and ``bincount`` count
what the release would report in ``update()`` (a device read each time) and report it
later instead, exactly once, without a read of their own (:mod:`tmpatch.runtime.deferred`):

* ``Metric._wrap_update`` (an edit of its ``wrapped_func``, at its end), ``Metric.forward``
  and ``Running.update``/``Running.forward``: after the user's call, what has reached the
  host is reported from it (:func:`deferred.after_update`: on the CPU at once, on a GPU
  once a non-blocking copy has landed); an attribute read while no book has anything due;
* ``Metric._wrap_compute`` (and the unwrapping overrides of ``WrapperMetric``, 1.1.0+,
  and ``CompositionalMetric``): a metric built while this patch is applied gets a book
  and, around its own compute, a layer that reports and clears the books of the metric
  and of the metrics inside it once the release's compute (and its sync) is done;
* ``Metric.forward``: the compute and reset torchmetrics makes inside ``forward()``
  report and clear nothing; a forward that runs ``update()`` twice (full-state update)
  counts the batch once;
* the other settle points, where the data that carries a pending report leaves the metric
  or is dropped: ``Metric.reset`` by the user (before it; an error is raised once the reset
  is done), ``Metric.state_dict`` (when a metric state is persistent), ``Metric.__getstate__``
  (pickles, ``torch.save``, copies), ``Metric.merge_state`` (1.6.0+: both metrics' books,
  before) and a user's ``Metric.sync`` (after its collectives): each reports the books as
  compute does, for the outermost wrapper or collection resetting, saving or cloning the
  metric (:func:`deferred.enclosing`), so that no copy of a state carries data whose report was never given;
* ``Running.update`` and ``Running.forward``: the base metric's reset inside them keeps
  the books (the report comes after the wrapper's call, or at its compute);
* ``MetricCollection.compute``: one report for the collection, after every metric's
  compute (up to 1.0.x: the ``_wrap_compute`` overrides of ClasswiseWrapper, MultioutputWrapper
  and MultitaskWrapper, not yet ``WrapperMetric`` subclasses, get the book layer too).

Releases: 0.10.0-1.9.0 (one to four implementations of each target, one of ``_wrap_update``,
which ``compiled_update`` and ``update_bookkeeping`` edit too; ``Running`` from 1.0.0). Up to
1.0.x ClasswiseWrapper, MultioutputWrapper (0.11.1+) and MultitaskWrapper (1.0.x) override
``_wrap_compute`` themselves.
``tmpatch.revert()`` keeps pending reports: the compute layer stays with the metrics
built while applied (:func:`deferred.detach`). What a metric still holds when it is
garbage-collected, or when the process or a ``multiprocessing`` child ends, is logged then
(:mod:`tmpatch.runtime.deferred.endings`).
"""
from __future__ import annotations

import functools
import inspect
from types import MethodType, ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.runtime import deferred
from tmpatch.runtime.compiled import compiling
from tmpatch.spec import DEFERRED, Edit, Label, Patch, Rewrite, Target, Together, Variant, since, span


def _settling(metric: Any, inner: Callable[..., Any]) -> Callable[..., Any]:
    """The metric's compute, reporting its books after the release's compute is done."""

    def compute(*args: Any, **kwargs: Any) -> Any:
        if deferred.internal() or (not deferred.is_live() and deferred.forward_step(1) is not None):
            return inner(*args, **kwargs)  # torchmetrics' own call (after revert: made by forward)
        deferred.start_compute(metric)
        with deferred.scope():
            value = inner(*args, **kwargs)
        deferred.settle(metric)
        return value

    try:
        functools.update_wrapper(compute, inner)
    except (AttributeError, TypeError):  # a callable without the usual attributes
        compute.__wrapped__ = inner  # type: ignore[attr-defined]  # as functools.wraps sets it
    if inspect.ismethod(inner) and inner.__self__ is metric:
        # WrapperMetric's _wrap_compute keeps the bound compute (1.1.0+): a bound method in the metric's
        # __dict__, as there (TorchScript scripts a plain function found there on its own: one warning more)
        def method(_self: Any, *args: Any, **kwargs: Any) -> Any:
            return compute(*args, **kwargs)

        functools.update_wrapper(method, compute)
        return MethodType(method, metric)
    return compute


def _build_wrap_compute(module: ModuleType) -> Callable[..., Any]:
    def _wrap_compute(original: Callable, self: Any, compute: Callable) -> Callable:
        inner = original(self, compute)
        book = deferred.open_book(self)
        settling = _settling(self, inner)
        deferred.attach(getattr(settling, "__func__", settling), book)
        return settling

    return _wrap_compute


def _full_state(metric: Any) -> bool:
    """Whether ``Metric.forward`` runs ``update()`` twice (every release's condition)."""
    full = getattr(metric, "full_state_update", None)
    return full or full is None or bool(getattr(metric, "dist_sync_on_step", False))


def _build_forward(module: ModuleType) -> Callable[..., Any]:
    watch = deferred.WATCH

    def forward(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        before: Optional[List[Tuple[deferred.Book, Dict[str, Any]]]] = None
        if _full_state(self):
            before = [(book, dict(book.counts)) for book in deferred.books_in(self)]
        tracing = compiling()
        marked = None if tracing else deferred.marks(self)
        with deferred.scope():
            result = original(self, *args, **kwargs)
        if before:
            for book, counts in before:
                deferred.count_once(book, counts)
        if marked:  # what its updates noted came from this forward() (torchmetrics reset the count inside)
            deferred.restamp(marked, self.__dict__.get("_update_count") or None)
        if not tracing and watch.on:  # what has reached the host: reported from this forward()
            deferred.after_update(self, "forward()")
        return result

    return forward


def _update_names(module: ModuleType) -> Dict[str, Any]:
    return {"_tmpatch_reports_traced": compiling, "_tmpatch_reports_watch": deferred.WATCH,
            "_tmpatch_reports_after": deferred.after_update}


#: ``Metric._wrap_update``'s ``wrapped_func``, at its end (the batch is in the states): what has reached
#: the host is reported from this ``update()`` (:func:`deferred.after_update`); a call of torch's check
#: and an attribute read while no book has anything due; nothing while torch.compile traces
AFTER_UPDATE = Rewrite(
    (Edit("if self.compute_on_cpu:\n    ...\n",
          "if self.compute_on_cpu:\n"
          "    __tmpatch_body__\n"
          "if not _tmpatch_reports_traced() and _tmpatch_reports_watch.on:\n"
          "    _tmpatch_reports_after(self)\n"),),
    _update_names,
)


def _users() -> bool:
    """Whether a settle point is the user's own call: not torchmetrics' (inside forward(), a
    compute(), a wrapper's update()), and not traced by torch.compile (a read there is a graph
    break, and the internal scope of a wrapper's update is lost across one: the report waits
    for the next settle point outside the compiled code)."""
    return not deferred.internal() and not compiling()


def _settle_at(metric: Any, where: str) -> None:
    """Report what ``metric`` and the metrics inside it hold, at a settle point other than
    compute: totals of an earlier sync (a forward's) are forgotten first, as at compute."""
    if deferred.pending(metric):
        deferred.start_compute(metric)
        deferred.settle(metric, where)


def _build_reset(module: ModuleType) -> Callable[..., Any]:
    """``Metric.reset`` by the user: the report first (its data is about to be dropped), for
    the outermost wrapper or collection resetting the metric (once for all its members). An
    error report never blocks the reset: the metric and every metric inside that holder are
    reset first (as the release's reset leaves them), then it is raised."""

    def reset(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        if _users():
            top = deferred.enclosing(self, _RESETS)
            try:
                _settle_at(top, "reset()")
            except Exception:
                original(self, *args, **kwargs)
                for inner in top.modules() if top is not self and hasattr(top, "modules") else ():
                    if inner is not self and isinstance(inner, module.Metric):
                        original(inner)  # the holder's own reset stops at the raise: its members reset here
                raise
        return original(self, *args, **kwargs)

    return reset


#: the methods of torchmetrics' wrappers and collections that reset the metrics inside them
_RESETS = ("reset", "reset_all")


def _persists(metric: Any) -> bool:
    """Whether ``metric``'s state_dict holds a metric state (of it or of a metric inside it)."""
    modules = metric.modules() if hasattr(metric, "modules") else (metric,)
    return any(any(getattr(inner, "_persistent", {}).values()) for inner in modules)


def _build_state_dict(module: ModuleType) -> Callable[..., Any]:
    """``Metric.state_dict``: the report first, when the state_dict carries a metric state
    (``persistent(True)``); for the outermost collection or wrapper taking it."""

    def state_dict(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        if _users() and deferred.pending(self):
            top = deferred.enclosing(self, ("state_dict",))
            if _persists(top):
                _settle_at(top, "state_dict()")
        return original(self, *args, **kwargs)

    return state_dict


def _build_getstate(module: ModuleType) -> Callable[..., Any]:
    """``Metric.__getstate__`` (pickle, ``torch.save``, ``copy``, ``clone()``): the report first."""

    def __getstate__(original: Callable, self: Any) -> Any:
        if _users() and deferred.pending(self):
            _settle_at(deferred.enclosing(self, ("clone",)), "pickling")
        return original(self)

    return __getstate__


def _build_merge_state(module: ModuleType) -> Callable[..., Any]:
    """``Metric.merge_state`` (1.6.0+): the reports of the incoming metric, then of this one,
    before any state moves."""
    metric_class = module.Metric

    def merge_state(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        if _users():
            incoming = args[0] if args else kwargs.get("incoming_state")
            if isinstance(incoming, metric_class):
                _settle_at(incoming, "merge_state()")
            _settle_at(self, "merge_state()")
        return original(self, *args, **kwargs)

    return merge_state


def _build_sync(module: ModuleType) -> Callable[..., Any]:
    """``Metric.sync`` by the user: the report once the sync is done on every rank (a report
    before it would leave the other ranks waiting in its collectives); with
    ``coalesced_sync`` it covers every rank. A raise puts the local states back (``unsync``)."""

    def sync(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _users():
            return original(self, *args, **kwargs)
        was = getattr(self, "_is_synced", False)
        if deferred.pending(self):
            deferred.start_compute(self)  # totals of an earlier sync (a forward's) are not this one's
        result = original(self, *args, **kwargs)
        if getattr(self, "_is_synced", False) and not was and deferred.pending(self):
            try:
                deferred.settle(self, "sync()")
            except BaseException:
                self.unsync()
                raise
        return result

    return sync


def _build_apply(module: ModuleType) -> Callable[..., Any]:
    """``Metric._apply`` (``.to()``, ``.cuda()``, ...): the book's traced counts move with the metric."""

    def _apply(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        fn = args[0] if args else kwargs.get("fn")
        deferred.moved(self, fn if callable(fn) else None)
        return result

    return _apply


def _build_collection_compute(module: ModuleType) -> Callable[..., Any]:
    """``MetricCollection.compute``: the metrics' computes inside it report nothing; the
    collection reports once for all of them when every compute is done (a raise in the
    first metric's report would otherwise leave the others' for the next compute)."""

    def compute(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        if deferred.internal():
            return original(self, *args, **kwargs)
        deferred.start_compute(self)
        with deferred.scope():
            value = original(self, *args, **kwargs)
        deferred.settle(self)
        return value

    return compute


def _running(call: str) -> Callable[[ModuleType], Callable[..., Any]]:
    """``Running.update``/``Running.forward``: they reset the base metric themselves; then, as after
    a metric's ``update()`` (a wrapper's is not ``wrapped_func``) or ``forward()``, what has reached
    the host is reported from them."""

    def build(module: ModuleType) -> Callable[..., Any]:
        watch = deferred.WATCH

        def method(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
            tracing = compiling()
            marked = None if tracing else deferred.marks(self)
            with deferred.scope():
                result = original(self, *args, **kwargs)
            if marked:  # the base metric's count is not the wrapper's (it resets it): not known
                deferred.restamp(marked, self.__dict__.get("_update_count") or None)
            if not tracing and watch.on:
                deferred.after_update(self, call)
            return result

        return method

    return build


_METRIC = "torchmetrics.metric"

PATCH = Patch(
    name="deferred_reports",
    summary="gives the reports nan_check and bincount move out of update() once, without a read of their own: "
            "at a later update() once on the host (on the CPU, the same one), or at compute(), at the latest "
            "when the metric or process goes; never inside forward()",
    known=since("0.10.0"),
    after_apply=deferred.went_live,
    after_revert=deferred.went_dormant,
    upstream="tmpatch's own: makes the deferred reports of other patches exact",
    changes="a NaN or out-of-range report comes once, after the batch is added: from the update() that saw it "
            "on the CPU, at most 16 counting updates later on a GPU (no sync), or where the data leaves the metric "
            "first (compute, reset, state_dict, pickle/copy, merge_state, sync), at the latest logged when the "
            "metric is collected or the process or worker ends; on the rank that saw it (on every rank with "
            "coalesced_sync); copies and forked children carry no pending report",
    labels=(
        Label(DEFERRED, "a patch's report (NaN seen, values out of range) moved from update to compute: one read",
              file="tmpatch/runtime/deferred/settling.py"),
    ),
    together=(Together("the settle points keep the books together: without one of them a report would be lost "
                       "or come late"),),
    targets=(
        Target(
            module=_METRIC,
            qualname="Metric._wrap_compute",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "4bacaba7208a2cb1", _build_wrap_compute),
                Variant(span("1.0.0", "1.2.1"), "1715a9ca799990bc", _build_wrap_compute),
                Variant(span("1.3.0.post0", "1.4.0.post0"), "c8e984dd5691953e", _build_wrap_compute),
                Variant(span("1.4.1", "1.9.0"), "13db1725dd4da7c4", _build_wrap_compute),
            ),
        ),
        Target(
            module=_METRIC,
            qualname="CompositionalMetric._wrap_compute",
            variants=(Variant(span("0.10.0", "0.11.4"), "3b15fc08bdd27821", _build_wrap_compute),
                      Variant(span("1.0.0", "1.9.0"), "05f55ce13420b558", _build_wrap_compute)),
        ),
        Target(
            module="torchmetrics.wrappers.abstract",
            qualname="WrapperMetric._wrap_compute",
            variants=(Variant(span("1.1.0", "1.9.0"), "05f55ce13420b558", _build_wrap_compute),),
            present=since("1.1.0"),
        ),
        *(
            Target(  # up to 1.0.x: these wrappers override Metric._wrap_compute (WrapperMetric from 1.1.0)
                module=f"torchmetrics.wrappers.{module}",
                qualname=f"{name}._wrap_compute",
                variants=(Variant(span(first, "1.0.3"), "05f55ce13420b558", _build_wrap_compute),),
                present=span(first, "1.0.3"),
            )
            for module, name, first in (("classwise", "ClasswiseWrapper", "0.10.0"),
                                        ("multioutput", "MultioutputWrapper", "0.11.1"),
                                        ("multitask", "MultitaskWrapper", "1.0.0"))
        ),
        Target(
            module="torchmetrics.collections",
            qualname="MetricCollection.compute",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "97cc99497c252f69", _build_collection_compute),
                Variant(span("1.0.0", "1.5.2"), "efbd8312bb0b8610", _build_collection_compute),
                Variant(span("1.6.0", "1.9.0"), "ebc04c290ed14244", _build_collection_compute),
            ),
        ),
        Target(
            module=_METRIC,
            qualname="Metric.forward",
            variants=(
                Variant(span("0.10.0", "1.6.1"), "5137161859288369", _build_forward),
                Variant(span("1.6.2", "1.9.0"), "2ea471ed4d896124", _build_forward),
            ),
        ),
        Target(
            module=_METRIC,
            qualname="Metric._wrap_update",
            variants=(Variant(span("0.10.0", "1.9.0"), "204d7412e16fe670", AFTER_UPDATE),),
        ),
        Target(
            module=_METRIC,
            qualname="Metric._apply",
            variants=(
                Variant(span("0.10.0", "0.11.3"), "dac6762c6713e022", _build_apply),
                Variant(span("0.11.4"), "d8c08b77a3493a58", _build_apply),
                Variant(span("1.0.0", "1.2.1"), "230dda1bf62c7927", _build_apply),
                Variant(span("1.3.0.post0", "1.9.0"), "232b818f8abf487b", _build_apply),
            ),
        ),
        Target(
            module=_METRIC,
            qualname="Metric.reset",
            variants=(
                Variant(span("0.10.0", "1.3.2"), "718dd05530d14777", _build_reset),
                Variant(span("1.4.0", "1.9.0"), "26a400138ffbd9ed", _build_reset),
            ),
        ),
        Target(
            module=_METRIC,
            qualname="Metric.state_dict",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "bbebc48a80bfe960", _build_state_dict),
                Variant(span("1.0.0", "1.3.1"), "053d8e2020a77d7a", _build_state_dict),
                Variant(span("1.3.2", "1.5.2"), "c0f248a8c69ecc78", _build_state_dict),
                Variant(span("1.6.0", "1.9.0"), "4c5aff2dc41d2932", _build_state_dict),
            ),
        ),
        Target(
            module=_METRIC,
            qualname="Metric.__getstate__",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "9996a30245e5558b", _build_getstate),
                Variant(span("1.0.0", "1.5.2"), "af232a93d4f8018a", _build_getstate),
                Variant(span("1.6.0", "1.9.0"), "ed346df0a94f210f", _build_getstate),
            ),
        ),
        Target(
            module=_METRIC,
            qualname="Metric.merge_state",
            variants=(Variant(span("1.6.0", "1.9.0"), "ebcfbc83b19d5368", _build_merge_state),),
            present=since("1.6.0"),
        ),
        Target(
            module=_METRIC,
            qualname="Metric.sync",
            variants=(
                Variant(span("0.10.0", "0.10.3"), "03e6fa6b93646a5f", _build_sync),  # no distributed_available_fn
                Variant(span("0.11.0", "1.3.2"), "11501a2cfbe5730e", _build_sync),
                Variant(span("1.4.0", "1.9.0"), "00416aa799a99c1b", _build_sync),
            ),
        ),
        Target(
            module="torchmetrics.wrappers.running",
            qualname="Running.update",
            variants=(Variant(span("1.0.0", "1.9.0"), "7edd255b4e36c7db", _running("update()")),),
            present=since("1.0.0"),
        ),
        Target(
            module="torchmetrics.wrappers.running",
            qualname="Running.forward",
            variants=(Variant(span("1.0.0", "1.9.0"), "4b5a6dd36ee40cec", _running("forward()")),),
            present=since("1.0.0"),
        ),
    ),
)
