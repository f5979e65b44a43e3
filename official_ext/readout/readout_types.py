"""The registry of readout types: what a `ReadoutSpec.type` means.

A readout type is everything the family knows about a kind of target, in one
`ReadoutType`: how many values a query stores, which stored values are
invalid, the per-query loss, the metrics (the first one is the primary
metric), and the activation that turns the head's output into the served
output. The task, the loss, the metrics, the dataloader's checks and the
export look the type up here (`get_readout_type`) and never branch on its
name, so a new type is one `register_readout_type` call in a module of its
own:

```python
from official_ext.readout import readout_types

readout_types.register_readout_type(readout_types.ReadoutType(
    name='huber',
    loss=lambda spec, p, y: tf_keras.losses.huber(y, p),  # [n]
    metrics=('r2',),
    compute_metrics=lambda spec, p, y, w: {'r2': metrics.r2_score(p, y, w)},
))
```

The module must be imported before a spec names its type: import it in your
program, as `official_ext.registry_imports` imports the families so that
their experiments register. This module imports no type: it is the registry
only.

Types shipped: 'continuous', 'binary', 'multinomial', 'multilabel',
'event_rate' (`builtin_types`) and 'von_mises' (`von_mises`, angular
targets), registered when `configs` (which every module of the family
imports) imports them.

Interfaces (spec = the task's `configs.ReadoutSpec`, dim = `spec.dim` = the
width of its head, size = `target_size(spec)`):

* `loss(spec, predictions, targets)`: float32 [n, dim] head outputs, float32
  [n, size] targets -> float32 [n] unweighted per-query losses. Must be
  finite and have a finite gradient for all-zero predictions and targets
  (`losses.loss_sums` zeroes the rows of weight 0 before calling it).
* `compute_metrics(spec, predictions, targets, weights)`: numpy float64
  [n, dim], [n, size], [n] (all weights > 0 are rows to score; n may be 0)
  -> {metric: float} for at least every name in `metrics`; NaN for a metric
  with nothing to measure. The primary metric, `metrics[0]`, must be "higher
  is better": `average/score` is the mean of the tasks' primary metrics.
* `target_size(spec)`: the number of values each query stores.
* `invalid_targets`: (what, fn) pairs; fn(values float32 [k], dims float32
  [k]) -> bool [k], True for a stored target value the type refuses (each
  value with its query's `dim`); the record's error says the query "has
  <what>: <value>". NaN and infinity are refused for every type.
* `serve(spec, outputs)`: float32 [..., dim] head outputs -> float32
  [..., k] the served output (`export`).
"""
import dataclasses
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

LossFn = Callable[[object, tf.Tensor, tf.Tensor], tf.Tensor]
MetricsFn = Callable[[object, np.ndarray, np.ndarray, np.ndarray],
                     Dict[str, float]]
CheckFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def _dim_target(spec) -> int:
  return int(spec.dim)


def _identity(spec, outputs: tf.Tensor) -> tf.Tensor:
  del spec
  return outputs


@dataclasses.dataclass(frozen=True)
class ReadoutType:
  """One readout type (module docstring: the interfaces).

  Attributes:
    name: the `ReadoutSpec.type` value.
    loss: (spec, predictions [n, dim], targets [n, size]) -> [n] losses.
    metrics: the metric names the type reports; the first is its primary
      metric (higher is better), averaged into `average/score`.
    compute_metrics: (spec, predictions, targets, weights) -> {metric: value}.
    target_size: spec -> values stored per query (default: `spec.dim`).
    target_doc: what a query stores, for error messages.
    min_dim: the smallest valid `spec.dim`.
    max_dim: the largest valid `spec.dim` (None: no limit).
    dim_doc: what `spec.dim` means for the type, for error messages.
    invalid_targets: ((what, fn), ...) target values the type refuses.
    serve: (spec, head outputs [..., dim]) -> served output [..., k]
      (default: the head outputs).
    torch_brain_metrics: the metrics reported under the 'torch_brain'
      evaluation protocol (`metrics`), the first its primary metric; empty:
      `metrics`. `compute_metrics` returns each of them too.
  """
  name: str
  loss: LossFn
  metrics: Tuple[str, ...]
  compute_metrics: MetricsFn
  target_size: Callable[[object], int] = _dim_target
  target_doc: str = 'the ReadoutSpec dim'
  min_dim: int = 1
  max_dim: Optional[int] = None
  dim_doc: str = 'the head width'
  invalid_targets: Tuple[Tuple[str, CheckFn], ...] = ()
  serve: Callable[[object, tf.Tensor], tf.Tensor] = _identity
  torch_brain_metrics: Tuple[str, ...] = ()

  def protocol_metrics(self, protocol: str = 'official_ext'
                       ) -> Tuple[str, ...]:
    """The metrics the type reports under an evaluation protocol
    ('official_ext' or 'torch_brain', `metrics`); the first is primary."""
    if protocol == 'torch_brain' and self.torch_brain_metrics:
      return self.torch_brain_metrics
    return self.metrics

  @property
  def known_metrics(self) -> Tuple[str, ...]:
    """Every metric a spec may name in `ReadoutSpec.metrics`."""
    return self.metrics + tuple(m for m in self.torch_brain_metrics
                                if m not in self.metrics)

  def dim_problem(self, dim: int) -> Optional[str]:
    """Why `dim` is not valid for this type (None: it is)."""
    if int(dim) >= self.min_dim and (self.max_dim is None or
                                     int(dim) <= self.max_dim):
      return None
    want = (f'{self.min_dim}' if self.max_dim == self.min_dim else
            f'>= {self.min_dim}' if self.max_dim is None else
            f'{self.min_dim}..{self.max_dim}')
    return f'expected {want} for type {self.name!r} ({self.dim_doc})'


_REGISTRY: Dict[str, ReadoutType] = {}


def register_readout_type(readout_type: ReadoutType) -> ReadoutType:
  """Registers a type under `readout_type.name`.

  Raises:
    ValueError: the name is taken, or the type has no metric.
  """
  if not isinstance(readout_type, ReadoutType):
    raise TypeError('register_readout_type expects a ReadoutType; got '
                    f'{type(readout_type).__name__}.')
  if readout_type.name in _REGISTRY:
    raise ValueError(f'Readout type {readout_type.name!r} is already '
                     'registered.')
  if not readout_type.metrics:
    raise ValueError(f'Readout type {readout_type.name!r}: metrics is empty; '
                     'expected at least its primary metric.')
  _REGISTRY[readout_type.name] = readout_type
  return readout_type


def unregister_readout_type(name: str) -> None:
  """Removes a registered type (tests; a spec naming it is then invalid)."""
  del _REGISTRY[name]


def registered_types() -> Tuple[str, ...]:
  """The registered type names, in registration order."""
  return tuple(_REGISTRY)


def metrics_by_type() -> Mapping[str, Tuple[str, ...]]:
  """{type: its metrics}; the first of each is its primary metric."""
  return {name: t.metrics for name, t in _REGISTRY.items()}


def get_readout_type(spec_or_type, where: str = '') -> ReadoutType:
  """The `ReadoutType` of a ReadoutSpec (or of a type name).

  Args:
    spec_or_type: a `configs.ReadoutSpec` (anything with `.type` and
      `.name`) or a type name.
    where: names the spec in the error (default: task.readouts `<name>`
      for a spec).

  Raises:
    ValueError: the type is not registered; the message names the spec and
      lists the registered types.
  """
  if isinstance(spec_or_type, str):
    type_name = spec_or_type
  else:
    type_name = spec_or_type.type
    where = where or f'task.readouts `{spec_or_type.name}`'
  if type_name not in _REGISTRY:
    raise ValueError(f'{where or "Readout"}: type {type_name!r}; expected one '
                     f'of the registered readout types {tuple(_REGISTRY)} '
                     '(official_ext.readout.readout_types).')
  return _REGISTRY[type_name]


def types_of(specs: Sequence[object]) -> Tuple[ReadoutType, ...]:
  """The distinct types of `specs`, in registration order."""
  wanted = {get_readout_type(s).name for s in specs}
  return tuple(t for name, t in _REGISTRY.items() if name in wanted)


def target_size(spec) -> int:
  """Values stored per query of a `configs.ReadoutSpec` (its type's
  `target_size`: e.g. 1 class id for multinomial, else `dim`)."""
  return get_readout_type(spec).target_size(spec)


def spec_metrics(spec, protocol: str = 'official_ext') -> Tuple[str, ...]:
  """The metrics a `configs.ReadoutSpec` reports: its own `metrics`, or
  every metric of its type under the evaluation `protocol`."""
  return (tuple(spec.metrics) or
          get_readout_type(spec).protocol_metrics(protocol))


def primary_metric(spec, protocol: str = 'official_ext') -> str:
  """The primary metric of a spec's type under `protocol` (averaged into
  `average/score`)."""
  return get_readout_type(spec).protocol_metrics(protocol)[0]
