"""Backward passes on simulated CUDA: the autograd graph walked in Python.

torch's autograd engine cannot run a graph of simulated CUDA tensors without a GPU: for
each gradient on an accelerator it asks for the device's current stream
(``InputBuffer::add``), which a CPU-only build refuses ("Cannot access accelerator device
when none is available") and a CUDA build answers through the no-op device guard of
:mod:`tmpatch.audit.oracle.guard`, which has no streams ("Backend doesn't support acquiring a
default stream"). While a simulation is active, ``Variable._execution_engine`` (what
``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` call) is a
:class:`SimulatedEngine`: a graph with a simulated tensor among its roots is walked here,
in the engine's order (ready nodes by decreasing sequence number, gradient accumulators
first), and each node's backward runs as on a GPU (its ops go through the simulation, so
a sync in a backward formula is seen); a graph of real host tensors goes to torch's engine.

Run as the engine runs them: tensor hooks (``Tensor.register_hook``, on leaves and on
intermediate tensors registered during the simulation), ``retain_grad()`` of tensors made
during it, post-accumulate-grad hooks, custom ``autograd.Function`` backwards,
``queue_callback``, ``inputs=`` and ``torch.autograd.grad``. Not run: hooks registered on
autograd nodes themselves (``grad_fn.register_hook``/``register_prehook``: module backward
hooks, DDP's reducer), which Python cannot see; :attr:`SimulatedEngine.calls` counts the
walks so that a report can say so. A graph is kept after a walk (``retain_graph=False``
frees nothing: a second backward does not raise).

Older torch (2.1) does not tell what a node expects of its gradients: there a backward
pass of simulated tensors is left out (:attr:`SimulatedEngine.left_out` counts them) and
zeros stand in for the gradients, so that the optimizer step after it runs.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.autograd.variable import Variable

Node = Any
Edge = Tuple[Node, int]

#: what a report says of a simulated backward pass
LEFT_OUT = "hooks on autograd nodes (module backward hooks, DDP) are not run"
#: what a report says of a backward pass this torch cannot walk
NOT_RUN = ("not run: this torch's autograd nodes do not say what gradients they expect (torch 2.1); zeros stand "
           "in for its gradients so that the rest of the step runs, its own ops are not audited")


def _accumulator(t: torch.Tensor) -> Node:
    """The gradient accumulator of a leaf that requires grad."""
    get = getattr(torch.autograd.graph, "get_gradient_edge", None)
    if get is not None:
        return get(t).node
    # torch < 2.2: through a view's graph (a view of a leaf that requires grad has a grad_fn)
    return t.view_as(t).grad_fn.next_functions[0][0]  # type: ignore[union-attr]  # see above


def _edge(t: Any, index: int, what: str = "tensors") -> Edge:
    if isinstance(t, tuple) and hasattr(t, "node") and hasattr(t, "output_nr"):  # a GradientEdge
        return t.node, t.output_nr
    if t.grad_fn is not None:
        return t.grad_fn, t.output_nr
    if t.requires_grad:
        return _accumulator(t), 0
    raise RuntimeError(f"element {index} of {what} does not require grad and does not have a grad_fn")


def _children(node: Node) -> Tuple[Edge, ...]:
    return tuple(node.next_functions)


def _inputs(node: Node) -> int:
    metadata = getattr(node, "_input_metadata", None)
    return len(metadata) if metadata is not None else 0


def _is_custom(node: Node) -> bool:
    return isinstance(node, torch.autograd.function.BackwardCFunction)


def _zeros(node: Node, index: int) -> Optional[torch.Tensor]:
    metadata = getattr(node, "_input_metadata", None)
    if metadata is None or index >= len(metadata):
        return None
    m = metadata[index]
    return torch.zeros(tuple(m.shape), dtype=m.dtype, device=m.device)


def _call(node: Node, grads: List[Optional[torch.Tensor]]) -> List[Optional[torch.Tensor]]:
    """Run one node's backward; one gradient per edge of ``node.next_functions``."""
    if not _is_custom(node):
        out = node(*grads)
        return list(out) if isinstance(out, tuple) else [out]
    if getattr(node, "materialize_grads", True):
        grads = [g if g is not None else _zeros(node, i) for i, g in enumerate(grads)]
    out = node.apply(*grads)
    out = list(out) if isinstance(out, tuple) else [out]
    edges = _children(node)
    if len(out) == len(edges):
        return out
    # one result per forward argument; the edges are those of its tensor arguments, and the
    # ones that carry a gradient are those of needs_input_grad, in order
    wanted = [i for i, need in enumerate(node.needs_input_grad) if need]
    valid = [k for k, (child, _) in enumerate(edges) if child is not None]
    mapped: List[Optional[torch.Tensor]] = [None] * len(edges)
    for k, i in zip(valid, wanted):
        mapped[k] = out[i] if i < len(out) else None
    return mapped


def _fit(grad: torch.Tensor, child: Node, index: int) -> torch.Tensor:
    """The engine's check of a gradient against what its consumer expects: summed to its
    shape where it broadcast, cast to its dtype."""
    metadata = getattr(child, "_input_metadata", None)
    if metadata is None or index >= len(metadata):
        return grad
    m = metadata[index]
    shape = tuple(m.shape)
    if tuple(grad.shape) != shape:
        grad = grad.sum_to_size(shape)
    if grad.dtype != m.dtype:
        grad = grad.to(m.dtype)
    return grad


def _walkable(tensors: Sequence[Any]) -> bool:
    """Whether this torch's autograd nodes say what they expect (``_input_metadata``, torch 2.2
    or so): the walk needs it to sum a broadcast gradient to its shape, as the engine does."""
    for t in tensors:
        try:
            node, _ = _edge(t, 0)
        except RuntimeError:
            continue
        return hasattr(node, "_input_metadata")
    return True


def _stand_in(tensors: Sequence[Any], inputs: Sequence[Any], accumulate_grad: bool) -> Tuple[Any, ...]:
    """A backward pass left out: zeros stand in for the gradients (of the leaves ``backward``
    reaches, which have none yet, or that ``grad`` returns), so the rest of the step runs."""
    if not accumulate_grad:
        return tuple(torch.zeros_like(t) if isinstance(t, torch.Tensor) else None for t in inputs)
    wanted = {id(t) for t in inputs}
    queue = [node for node, _ in (_edge(t, i) for i, t in enumerate(tensors))]
    seen = set(queue)
    with torch.no_grad():
        while queue:
            node = queue.pop()
            leaf = getattr(node, "variable", None)
            if leaf is not None and leaf.grad is None and (not wanted or id(leaf) in wanted):
                leaf.grad = torch.zeros_like(leaf)
            for child, _ in _children(node):
                if child is not None and child not in seen:
                    seen.add(child)
                    queue.append(child)
    return ()


def _simulated(values: Sequence[Any]) -> bool:
    return any(isinstance(v, FakeTensor) or (isinstance(v, torch.Tensor) and v.device.type == "cuda")
               for v in values)


class SimulatedEngine:
    """``Variable._execution_engine`` while a simulation is active (see the module docstring)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls = 0  #: graphs walked here
        self.left_out = 0  #: graphs this torch cannot walk (see :func:`_walkable`), not run
        self.hooks: Dict[Edge, Dict[int, Any]] = {}  #: (grad_fn, output_nr) -> the tensors' hook dicts
        self.retained: Dict[Edge, Any] = {}  #: (grad_fn, output_nr) -> weak reference to the tensor
        self._callbacks: Optional[List[Callable[[], None]]] = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def queue_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the end of the backward pass in progress."""
        if self._callbacks is None:
            self.real.queue_callback(callback)
        else:
            self._callbacks.append(callback)

    def run_backward(self, tensors: Sequence[Any], grad_tensors: Sequence[Any], keep_graph: bool,
                     create_graph: bool, inputs: Sequence[Any] = (), allow_unreachable: bool = False,
                     accumulate_grad: bool = True) -> Tuple[Optional[torch.Tensor], ...]:
        """What torch's engine does for ``backward``/``grad``, on simulated tensors."""
        roots = [t for t in tensors if isinstance(t, torch.Tensor)]
        if not _simulated(list(roots) + list(grad_tensors) + [t for t in inputs if isinstance(t, torch.Tensor)]):
            return self.real.run_backward(tensors, grad_tensors, keep_graph, create_graph, inputs,
                                          allow_unreachable, accumulate_grad)
        if not _walkable(tensors):
            self.left_out += 1
            return _stand_in(tensors, inputs, accumulate_grad)
        self.calls += 1
        outer, self._callbacks = self._callbacks, []
        try:
            result = self._walk(tensors, grad_tensors, create_graph, inputs, allow_unreachable, accumulate_grad)
            while self._callbacks:
                self._callbacks.pop(0)()
        finally:
            self._callbacks = outer
        return result

    # --- the walk --------------------------------------------------------------------------

    def _walk(self, tensors: Sequence[Any], grad_tensors: Sequence[Any], create_graph: bool, inputs: Sequence[Any],
              allow_unreachable: bool, accumulate_grad: bool) -> Tuple[Optional[torch.Tensor], ...]:
        roots = [_edge(t, i) for i, t in enumerate(tensors)]
        targets = [_edge(t, i, "inputs") for i, t in enumerate(inputs)]
        if accumulate_grad:
            for t in inputs:
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    t.retain_grad()  # as torch's engine does for backward(inputs=...)
        dependencies, parents = self._graph([node for node, _ in roots])
        run = self._needed(targets, parents, accumulate_grad) if targets else None
        capture = {edge: i for i, edge in enumerate(targets)} if not accumulate_grad else {}
        capturing = {node for node, _ in capture}
        captured: List[Optional[torch.Tensor]] = [None] * len(targets)
        reached = [False] * len(targets)

        buffers: Dict[Node, List[Optional[torch.Tensor]]] = {}
        order = itertools.count()
        ready: List[Tuple[int, int, Node]] = []
        for (node, nr), grad in zip(roots, grad_tensors):
            self._add(buffers, node, nr, grad)
        for node in dict.fromkeys(node for node, _ in roots):
            if dependencies.get(node, 0) == 0:
                heapq.heappush(ready, (-node._sequence_nr(), next(order), node))
        with torch.set_grad_enabled(create_graph):
            while ready:
                node = heapq.heappop(ready)[2]
                grads = self._pre_hooks(node, buffers.pop(node, []))
                for nr, grad in enumerate(grads):
                    if (node, nr) in capture:
                        captured[capture[(node, nr)]], reached[capture[(node, nr)]] = grad, True
                if run is not None and node not in run:
                    continue
                outputs = _call(node, grads)
                for (child, nr), grad in zip(_children(node), outputs):
                    if child is None:
                        continue
                    if grad is not None:
                        self._add(buffers, child, nr, _fit(grad, child, nr))
                    dependencies[child] -= 1
                    if dependencies[child] == 0 and (run is None or child in run or child in capturing):
                        heapq.heappush(ready, (-child._sequence_nr(), next(order), child))
        if not accumulate_grad and not allow_unreachable and not all(reached):
            raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. "
                               "Set allow_unused=True if this is the desired behavior.")
        return tuple(captured) if not accumulate_grad else ()

    @staticmethod
    def _graph(starts: Sequence[Node]) -> Tuple[Dict[Node, int], Dict[Node, Set[Node]]]:
        """Incoming edges per node, and each node's parents, over the graph reachable from ``starts``."""
        dependencies: Dict[Node, int] = {}
        parents: Dict[Node, Set[Node]] = {}
        seen = set(starts)
        queue = list(seen)
        while queue:
            node = queue.pop()
            for child, _ in _children(node):
                if child is None:
                    continue
                dependencies[child] = dependencies.get(child, 0) + 1
                parents.setdefault(child, set()).add(node)
                if child not in seen:
                    seen.add(child)
                    queue.append(child)
        return dependencies, parents

    @staticmethod
    def _needed(targets: Sequence[Edge], parents: Dict[Node, Set[Node]], accumulate_grad: bool) -> Set[Node]:
        """The nodes that run when only ``targets`` are wanted: those with a path to one of them
        (and, for ``backward(inputs=...)``, the targets themselves)."""
        queue = [parent for node, _ in targets for parent in parents.get(node, ())]
        needed: Set[Node] = set(queue)
        if accumulate_grad:
            needed.update(node for node, _ in targets)
        while queue:
            for parent in parents.get(queue.pop(), ()):
                if parent not in needed:
                    needed.add(parent)
                    queue.append(parent)
        return needed

    @staticmethod
    def _add(buffers: Dict[Node, List[Optional[torch.Tensor]]], node: Node, nr: int,
             grad: Optional[torch.Tensor]) -> None:
        buffer = buffers.setdefault(node, [None] * _inputs(node))
        if len(buffer) <= nr:
            buffer.extend([None] * (nr + 1 - len(buffer)))
        if grad is not None:
            held = buffer[nr]
            buffer[nr] = grad if held is None else held + grad

    def _pre_hooks(self, node: Node, grads: List[Optional[torch.Tensor]]) -> List[Optional[torch.Tensor]]:
        """Tensor hooks and ``retain_grad`` of the tensors whose gradients ``node`` receives."""
        grads = list(grads) or [None] * max(_inputs(node), 1)
        variable = getattr(node, "variable", None)  # a gradient accumulator: its leaf's hooks
        for nr in range(len(grads)):
            dicts = list(self.hooks.get((node, nr), {}).values())
            if variable is not None and nr == 0 and getattr(variable, "_backward_hooks", None):
                dicts.append(variable._backward_hooks)
            for hooks in dicts:
                for hook in list(hooks.values()):
                    if grads[nr] is None:
                        break
                    out = hook(grads[nr])
                    if out is not None:
                        grads[nr] = out
            ref = self.retained.get((node, nr))
            tensor = ref() if ref is not None else None
            grad = grads[nr]
            if tensor is not None and grad is not None:
                with torch.no_grad():
                    tensor.grad = grad.clone() if tensor.grad is None else tensor.grad + grad
        return grads


@contextlib.contextmanager
def installed() -> Iterator[SimulatedEngine]:
    """:class:`SimulatedEngine` in place of torch's for the block (and the tensor-hook
    registrations it must see); everything is put back after it."""
    real = Variable._execution_engine
    engine = SimulatedEngine(real.real if isinstance(real, SimulatedEngine) else real)
    register, own_retain = torch.Tensor.register_hook, "retain_grad" in vars(torch.Tensor)
    retain = torch.Tensor.retain_grad

    def register_hook(self: torch.Tensor, hook: Callable[..., Any]) -> Any:
        handle = register(self, hook)
        hooks = getattr(self, "_backward_hooks", None)
        if self.grad_fn is not None and hooks is not None:
            engine.hooks.setdefault((self.grad_fn, self.output_nr), {})[id(hooks)] = hooks
        return handle

    def retain_grad(self: torch.Tensor) -> None:
        retain(self)
        if self.grad_fn is not None:
            engine.retained[(self.grad_fn, self.output_nr)] = weakref.ref(self)

    register_hook.__doc__, retain_grad.__doc__ = register.__doc__, retain.__doc__
    Variable._execution_engine = engine  # type: ignore[assignment]  # stands in for torch's engine (duck-typed)
    torch.Tensor.register_hook = register_hook  # type: ignore[method-assign]  # for the block, put back below
    torch.Tensor.retain_grad = retain_grad  # type: ignore[method-assign, assignment]  # the hook, put back below
    try:
        yield engine
    finally:
        Variable._execution_engine = real
        torch.Tensor.register_hook = register  # type: ignore[method-assign]  # torch's own, back
        if own_retain:
            torch.Tensor.retain_grad = retain  # type: ignore[method-assign]  # torch's own, back
        else:
            del torch.Tensor.retain_grad
