"""pearson_update's replacements: what each one learns, and the edited condition that uses it."""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, Optional

from tmpatch.patches.pearson_update.knowledge import (
    counts_known,
    cpu_zeros,
    current,
    default_of,
    default_zero,
    is_pearson,
    learn,
    learn_default_zero,
    moves_values,
)
from tmpatch.spec import Edit, Rewrite


def build_init(module: ModuleType) -> Callable[..., Any]:
    """``PearsonCorrCoef.__init__``: the release registers ``n_total`` as zeros (its default too)."""

    def __init__(original: Callable, self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        counts: Any = getattr(self, "n_total", None)
        if getattr(counts, "ndim", None) == 1 and counts.shape[0] > 0:  # zeros(num_outputs), as registered
            learn(self, False, True)
            learn_default_zero(self)

    return __init__


def build_apply(module: ModuleType) -> Callable[..., Any]:
    """``Metric._apply``: zero counts and a zero default stay known across a move or cast (counts
    on the CPU, a copy or a load there, are read first: free)."""
    import torch

    tensor_type = torch.Tensor

    def _apply(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_pearson(self):
            return original(self, *args, **kwargs)
        zeros = counts_known(self).zeros
        if zeros is None:
            zeros = cpu_zeros(getattr(self, "n_total", None), tensor_type)
        default_known = default_zero(self) or cpu_zeros(default_of(self), tensor_type)
        result = original(self, *args, **kwargs)
        if moves_values(args[0] if args else kwargs.get("fn")):
            if zeros:
                learn(self, False, True)
            if default_known:
                learn_default_zero(self)
        return result

    return _apply


def build_copy_state(module: ModuleType) -> Callable[..., Any]:
    """``Metric._copy_state_dict`` (``forward()`` saves the states in it, and puts them back after
    the batch's update): the copy of known counts is known."""

    def _copy_state_dict(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        cache = original(self, *args, **kwargs)
        if is_pearson(self) and isinstance(cache, dict):
            known = counts_known(self)
            if known.positive is not None and cache.get("n_total") is not None:
                learn(self, known.positive, known.zeros, counts=cache["n_total"])
        return cache

    return _copy_state_dict


def build_reset(module: ModuleType) -> Callable[..., Any]:
    """``Metric.reset``: the counts are a copy of the default, zeros while the default is the one known."""

    def reset(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if is_pearson(self) and default_zero(self):
            learn(self, False, True)
        return result

    return reset


def build_update(module: ModuleType) -> Callable[..., Any]:
    """``PearsonCorrCoef.update``: the condition known from what was learned, learned for the next."""

    def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        state = counts_known(self)
        token = current.set(state)
        try:
            result = original(self, *args, **kwargs)
        finally:
            current.reset(token)
        learn(self, state.after, state.after_zeros)
        return result

    return update


def _rewrite_names(module: ModuleType) -> Dict[str, Any]:
    import torch

    int64 = torch.int64

    def prior_positive(num_prior: Any, preds: Any) -> Any:
        """The release's ``num_prior.mean() > 0``: a host bool when the class update knows it (or
        has it read, with whether the counts are all zero, in one transfer), else the release's tensor."""
        state = current.get()
        if state is None:
            return num_prior.mean() > 0
        zeros = state.zeros
        if state.positive is None:  # one read: 2 * (mean > 0) + (all zero)
            code = int(((num_prior.mean() > 0).to(int64) * 2 + (num_prior == 0).all().to(int64)).item())
            state.positive, zeros = code >= 2, bool(code & 1)
        num_obs = preds.shape[0] if preds.dim() else 1
        if state.positive:
            state.after, state.after_zeros = True, False  # every count grows by num_obs >= 0: the mean stays positive
        elif zeros and num_prior.numel():
            state.after, state.after_zeros = num_obs > 0, num_obs == 0  # every count is num_obs
        return state.positive

    return {"_tmpatch_prior_positive": prior_positive}


def edit(prior: str, obs: Optional[str]) -> Rewrite:
    tail = f" or {obs} == 1" if obs else ""
    return Rewrite((Edit(f"cond = {prior}.mean() > 0{tail}", f"cond = _tmpatch_prior_positive({prior}, preds){tail}"),),
                   _rewrite_names)

