"""Optimizers: update rules as graph operations, and the classes that build a training step.

The update rules are composites of primitives registered as Graph methods under
MPSGraph's names, so the compiler can stitch each rule into one kernel:

* ``g.stochastic_gradient_descent(learning_rate, values, gradient)``
* ``g.stochastic_gradient_descent_momentum(learning_rate, momentum, values, velocity, gradient)``
* ``g.adam(learning_rate, beta1, beta2, epsilon, beta1_power, beta2_power, values, momentum,
  velocity, gradient)``

Each returns the new value (or values, for the rules with state); pass them to
``assign_variable``. Hyperparameters are Python floats or scalar tensors: a
placeholder fed at every run, or a variable, makes a schedule. The arithmetic
is torch.optim's, so the same model trained here and with torch.optim from the
same weights agrees to rounding. Half-type (float16, bfloat16) tensors are
updated in float32 and rounded once: hyperparameters near 1 do not survive a
half type (beta2 = 0.999 is 1.0 in bfloat16, and Adam's bias correction 1 -
beta2**t becomes a fraction of what it is).

`SGD`, `Adam` and `AdamW` put the pieces together: ``opt.minimize(graph, loss,
variables)`` builds the gradients, the updates and the optimizer state (moments
and the step count, as variables of the graph) and returns the assignments to
pass as target operations. A run applies assignments at its end, so a run that
targets the loss and these operations returns the loss before the update.

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph()
    >>> w = g.variable(np.array([1.0, -2.0]), name="w")
    >>> loss = g.reduction_sum(w * w)
    >>> steps = sm.optim.SGD(0.25).minimize(g, loss, [w])
    >>> for _ in range(2):
    ...     print(g.run(targets=[loss], target_ops=steps, device="cpu")[loss].item())
    5.0
    1.25
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence, Union

import torch

from . import dtypes
from .composites import composite
from .errors import GraphError
from .ir import Operation, Tensor

Hyper = Union[float, Tensor]  # a hyperparameter: a Python number or a scalar tensor of the graph


# -- helpers shared by the rules ------------------------------------------------------------
def _scalar(g, op: str, what: str, value: Any, like: Tensor) -> Tensor:
    """A hyperparameter as a scalar tensor of `like`'s dtype."""
    if isinstance(value, Tensor):
        if value.rank != 0:
            raise g._error(op, f"{what} must be a scalar tensor (shape ()), got shape {value.shape}", [value])
        return value if value.dtype == like.dtype else g.cast(value, like.dtype)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return g.constant(float(value), like.dtype)
    raise g._error(op, f"{what} must be a number or a scalar tensor, got {type(value).__name__}", [like])


def _operands(g, op: str, values: Tensor, *others: Tensor | None) -> None:
    """Check that `values` is floating point and that gradient and state tensors match it."""
    if not isinstance(values, Tensor) or not values.dtype.is_floating:
        raise g._error(op, f"values must be a floating-point tensor, got {values!r}", [values])
    for t in others:
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise g._error(op, f"expected tensors like the values ({values.type}), got {type(t).__name__}", [values])
        if t.dtype != values.dtype or t.shape != values.shape:
            raise g._error(op, f"every state and gradient tensor must be {values.type} like the values, "
                               f"got {t.name}: {t.type}", [values, t])


def _widened(g, *tensors: Tensor | None) -> list[Tensor | None]:
    """Half-type tensors cast to float32, the type the rules compute in for them; others as they are."""
    return [g.cast(t, dtypes.float32) if t is not None and t.dtype in (dtypes.float16, dtypes.bfloat16) else t
            for t in tensors]


def _rounded(g, like: Tensor, *tensors: Tensor) -> list[Tensor]:
    """Results back in the dtype of `like` (the values)."""
    return [t if t.dtype == like.dtype else g.cast(t, like.dtype) for t in tensors]


def _is_zero(value: Any) -> bool:
    return not isinstance(value, Tensor) and value == 0


def _float64(g, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value if value.dtype == dtypes.float64 else g.cast(value, dtypes.float64)
    return g.constant(float(value), dtypes.float64)


def _l2(g, op: str, gradient: Tensor, values: Tensor, weight_decay: Any) -> Tensor:
    """L2 regularisation folded into the gradient: ``gradient + weight_decay * values``."""
    if _is_zero(weight_decay):
        return gradient
    return gradient + _scalar(g, op, "weight_decay", weight_decay, values) * values


# -- the rules, as composites -----------------------------------------------------------------
@composite
def stochastic_gradient_descent(g, learning_rate, values, gradient, weight_decay=0.0):
    """``values - learning_rate * (gradient + weight_decay * values)`` (MPSGraph stochasticGradientDescent).

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); w = g.variable(np.array([1.0, 2.0]))
    >>> new = g.stochastic_gradient_descent(0.5, w, g.constant(np.array([2.0, 2.0])))
    >>> g.run(targets=[new], device="cpu")[new].numpy().tolist()
    [0.0, 1.0]
    """
    op = "stochastic_gradient_descent"
    _operands(g, op, values, gradient)
    wide, gradient = _widened(g, values, gradient)
    gradient = _l2(g, op, gradient, wide, weight_decay)
    return _rounded(g, values, wide - _scalar(g, op, "learning_rate", learning_rate, wide) * gradient)[0]


@composite
def stochastic_gradient_descent_momentum(g, learning_rate, momentum, values, velocity, gradient,
                                         nesterov=False, weight_decay=0.0):
    """SGD with momentum (torch.optim.SGD, dampening 0); returns ``(values, velocity)``.

    ``d = gradient + weight_decay * values``; ``velocity' = momentum * velocity + d``;
    ``values' = values - learning_rate * (d + momentum * velocity' if nesterov else velocity')``.
    A velocity that starts at zero gives torch's first step (velocity = d).
    """
    op = "stochastic_gradient_descent_momentum"
    _operands(g, op, values, velocity, gradient)
    wide, velocity, gradient = _widened(g, values, velocity, gradient)
    d = _l2(g, op, gradient, wide, weight_decay)
    mu = _scalar(g, op, "momentum", momentum, wide)
    velocity = mu * velocity + d
    direction = d + mu * velocity if nesterov else velocity
    new = wide - _scalar(g, op, "learning_rate", learning_rate, wide) * direction
    return tuple(_rounded(g, values, new, velocity))


@composite
def adam(g, learning_rate, beta1, beta2, epsilon, beta1_power, beta2_power, values, momentum, velocity,
         gradient, maximum_velocity=None, weight_decay=0.0, decoupled_weight_decay=False):
    """One Adam step (MPSGraph adam); returns ``[values, momentum, velocity]``, plus the new
    maximum velocity when `maximum_velocity` is given (AMSGrad).

    `beta1_power` and `beta2_power` are ``beta1**t`` and ``beta2**t`` for this step t (the
    first step is t = 1). With `weight_decay`, the decay is L2 (added to the gradient, as
    torch.optim.Adam) or, with `decoupled_weight_decay`, AdamW's ``values *= 1 - lr * wd``::

        m' = beta1 m + (1 - beta1) gradient
        v' = beta2 v + (1 - beta2) gradient²
        values' = values - lr / (1 - beta1_power) * m' / (sqrt(v') / sqrt(1 - beta2_power) + epsilon)

    epsilon is added after the bias correction, as torch.optim.Adam does (MPSGraph adds it
    before), so the two agree to rounding.
    """
    op = "adam"
    _operands(g, op, values, momentum, velocity, gradient, maximum_velocity)
    like = values
    values, momentum, velocity, gradient, maximum_velocity = _widened(g, values, momentum, velocity, gradient,
                                                                      maximum_velocity)
    lr = _scalar(g, op, "learning_rate", learning_rate, values)
    b1, b2 = _scalar(g, op, "beta1", beta1, values), _scalar(g, op, "beta2", beta2, values)
    if decoupled_weight_decay:
        if not _is_zero(weight_decay):
            values = values * (1.0 - lr * _scalar(g, op, "weight_decay", weight_decay, values))
    else:
        gradient = _l2(g, op, gradient, values, weight_decay)
    momentum = b1 * momentum + (1.0 - b1) * gradient
    velocity = b2 * velocity + (1.0 - b2) * (gradient * gradient)
    second = velocity
    if maximum_velocity is not None:
        maximum_velocity = g.maximum(maximum_velocity, velocity)
        second = maximum_velocity
    correction1 = 1.0 - _scalar(g, op, "beta1_power", beta1_power, values)
    correction2 = 1.0 - _scalar(g, op, "beta2_power", beta2_power, values)
    denominator = g.square_root(second) / g.square_root(correction2) + _scalar(g, op, "epsilon", epsilon, values)
    values = values - (lr / correction1) * (momentum / denominator)
    return _rounded(g, like, values, momentum, velocity, *([maximum_velocity] if maximum_velocity is not None else []))


# -- optimizers -------------------------------------------------------------------------------
def _trainable(graph, variables: Sequence[Tensor], where: str) -> list[Tensor]:
    if isinstance(variables, Tensor):
        variables = [variables]
    out = []
    for v in variables:
        if not isinstance(v, Tensor) or v.graph is not graph or v.op.op != "variable":
            raise GraphError(f"{where}: expected variables of this graph (made by graph.variable), got {v!r}")
        if not v.dtype.is_floating:
            raise GraphError(f"{where}: variable {v.name} is {v.dtype}; only floating-point variables train")
        if v not in out:
            out.append(v)
    return out


class Optimizer:
    """Builds a training step for a list of variables; subclasses give the update rule.

    `state` maps each trained variable to its optimizer's variables, keyed by their role
    (``"velocity"``, ``"momentum"``, ``"maximum_velocity"``, ``"step"``), so they can be
    saved and restored with the weights.
    """

    def __init__(self) -> None:
        self.state: dict[Tensor, dict[str, Tensor]] = {}

    def minimize(self, graph, loss: Tensor, variables: Sequence[Tensor], data_parallel: str | None = None,
                 bucket_bytes: int | None = None) -> list[Operation]:
        """Gradients of `loss` with respect to `variables` only, and their updates.

        Returns the assignments to pass as ``target_ops``. Variables that are not listed
        are read but never changed, so two optimizers can train two networks that share
        one graph (the generator and the discriminator of a GAN).

        `data_parallel` names a process group (``"world"``: every process torchrun started): the
        gradients are averaged over its processes before the update (stitchml.distributed), in
        buckets of `bucket_bytes`, so each process applies the same update to the same weights.
        """
        variables = _trainable(graph, variables, f"{type(self).__name__}.minimize")
        if data_parallel is not None:
            from .distributed import DEFAULT_BUCKET_BYTES, data_parallel as averaged  # same layer, on demand

            grads = averaged(graph, loss, variables, data_parallel, bucket_bytes or DEFAULT_BUCKET_BYTES)
            return self.apply_gradients(graph, {v: grads[v] for v in variables})
        grads = graph.gradients(loss, variables)
        return self.apply_gradients(graph, {v: grads[v] for v in variables})

    def apply_gradients(self, graph, gradients: Mapping[Tensor, Tensor]) -> list[Operation]:
        """Updates for precomputed ``{variable: gradient}``; returns the assignments."""
        variables = _trainable(graph, list(gradients), f"{type(self).__name__}.apply_gradients")
        if not variables:
            return []
        with graph.scope(type(self).__name__):
            shared, shared_updates = self._shared_state(graph)
            updates = []
            for v in variables:
                state = dict(shared)
                updates += self._update(graph, v, gradients[v], state)
                self.state[v] = {role: t for role, t in state.items() if t.op.op == "variable"}
        return updates + shared_updates

    def _shared_state(self, graph) -> tuple[dict[str, Tensor], list[Operation]]:
        """State common to the variables of one step (Adam's step count) and its updates."""
        return {}, []

    def _update(self, graph, v: Tensor, gradient: Tensor, state: dict[str, Tensor]) -> list[Operation]:
        raise NotImplementedError

    @staticmethod
    def _zeros_like(graph, v: Tensor, what: str) -> Tensor:
        return graph.variable(torch.zeros(v.shape, dtype=v.dtype.torch), name=f"{v.name}/{what}")


class SGD(Optimizer):
    """Stochastic gradient descent, with optional momentum, Nesterov momentum and L2 weight decay
    (torch.optim.SGD with dampening 0).

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); w = g.variable(np.array([3.0]), name="w")
    >>> steps = sm.optim.SGD(0.1, momentum=0.9).minimize(g, g.reduction_sum(w * w), [w])
    >>> for _ in range(2): _ = g.run(target_ops=steps, device="cpu")
    >>> round(g.variable_value(w).item(), 6)  # 3 - 0.1 * 6, then 2.4 - 0.1 * (0.9 * 6 + 4.8)
    1.38
    """

    def __init__(self, learning_rate: Hyper, momentum: Hyper = 0.0, nesterov: bool = False,
                 weight_decay: Hyper = 0.0) -> None:
        super().__init__()
        if nesterov and _is_zero(momentum):
            raise GraphError("SGD: nesterov=True needs a nonzero momentum")
        self.learning_rate, self.momentum, self.nesterov, self.weight_decay = learning_rate, momentum, nesterov, weight_decay

    def _update(self, graph, v, gradient, state):
        if _is_zero(self.momentum):
            return [graph.assign_variable(v, graph.stochastic_gradient_descent(
                self.learning_rate, v, gradient, weight_decay=self.weight_decay))]
        state["velocity"] = self._zeros_like(graph, v, "velocity")
        new_v, velocity = graph.stochastic_gradient_descent_momentum(
            self.learning_rate, self.momentum, v, state["velocity"], gradient, nesterov=self.nesterov,
            weight_decay=self.weight_decay)
        return [graph.assign_variable(v, new_v), graph.assign_variable(state["velocity"], velocity)]


class Adam(Optimizer):
    """Adam (torch.optim.Adam): L2 weight decay by default, AdamW's decoupled decay with
    `decoupled_weight_decay=True`, AMSGrad with `amsgrad=True`. The step count is a variable
    of the graph, shared by the variables of one `minimize`.

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); w = g.variable(np.array([3.0]), name="w")
    >>> steps = sm.optim.Adam(0.1).minimize(g, g.reduction_sum(w * w), [w])
    >>> _ = g.run(target_ops=steps, device="cpu")
    >>> round(g.variable_value(w).item(), 6)  # Adam's first step moves by the learning rate
    2.9
    """

    def __init__(self, learning_rate: Hyper = 1e-3, beta1: Hyper = 0.9, beta2: Hyper = 0.999,
                 epsilon: Hyper = 1e-8, weight_decay: Hyper = 0.0, amsgrad: bool = False,
                 decoupled_weight_decay: bool = False) -> None:
        super().__init__()
        self.learning_rate, self.beta1, self.beta2, self.epsilon = learning_rate, beta1, beta2, epsilon
        self.weight_decay, self.amsgrad, self.decoupled_weight_decay = weight_decay, amsgrad, decoupled_weight_decay

    def _shared_state(self, graph):
        # Counted in float64 whatever the weights' type, so beta**t stays exact in long runs.
        step = graph.variable(torch.zeros((), dtype=torch.float64), name="adam_step")
        t = step + 1.0
        powers = {f"beta{i}_power": graph.power(_float64(graph, beta), t)
                  for i, beta in ((1, self.beta1), (2, self.beta2))}
        return {"step": step, **powers}, [graph.assign_variable(step, t)]

    def _update(self, graph, v, gradient, state):
        state["momentum"] = self._zeros_like(graph, v, "momentum")
        state["velocity"] = self._zeros_like(graph, v, "velocity")
        if self.amsgrad:
            state["maximum_velocity"] = self._zeros_like(graph, v, "maximum_velocity")
        new = graph.adam(self.learning_rate, self.beta1, self.beta2, self.epsilon, state["beta1_power"],
                         state["beta2_power"], v, state["momentum"], state["velocity"], gradient,
                         maximum_velocity=state.get("maximum_velocity"), weight_decay=self.weight_decay,
                         decoupled_weight_decay=self.decoupled_weight_decay)
        targets = [v, state["momentum"], state["velocity"]] + ([state["maximum_velocity"]] if self.amsgrad else [])
        return [graph.assign_variable(target, value) for target, value in zip(targets, new)]


class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW; default weight_decay 0.01)."""

    def __init__(self, learning_rate: Hyper = 1e-3, beta1: Hyper = 0.9, beta2: Hyper = 0.999,
                 epsilon: Hyper = 1e-8, weight_decay: Hyper = 1e-2, amsgrad: bool = False) -> None:
        super().__init__(learning_rate, beta1, beta2, epsilon, weight_decay, amsgrad, decoupled_weight_decay=True)


__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]
