"""The registry of readout types: what a `ReadoutSpec.type` means.

A new type is one `register_readout_type` call in a module imported before
a spec names it (docs/readout.md#readout-types).
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
  """One readout type: target size and checks, loss, metrics, served output.

  Attributes:
    name: the `ReadoutSpec.type` value.
    loss: (spec, predictions f32 [n, dim], targets f32 [n, size]) -> f32 [n]
      per-query losses, finite with a finite gradient at all zeros.
    metrics: the metric names; the first is primary (higher is better).
    compute_metrics: (spec, predictions, targets, weights: numpy [n, dim],
      [n, size], [n]) -> {metric: float}; NaN with nothing to measure.
    target_size: spec -> values stored per query (default: `spec.dim`).
    target_doc, dim_doc: what a query stores, what `dim` means (for errors).
    min_dim, max_dim: the valid `spec.dim` range (max_dim None: no limit).
    invalid_targets: ((what, fn(values [k], dims [k]) -> bool [k]), ...):
      target values refused (NaN and infinity are refused for every type).
    serve: (spec, head outputs [..., dim]) -> served output [..., k].
    torch_brain_metrics: the metrics under the 'torch_brain' protocol, the
      first primary; empty: `metrics`.
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
    """The metrics reported under `protocol`; the first is primary."""
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
  """Registers a type; ValueError if its name is taken or it has no metric."""
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
  """The `ReadoutType` of a ReadoutSpec or type name.

  Raises:
    ValueError: the type is not registered (naming `where` or the spec and
      listing the registered types).
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
  """Values stored per query of a `configs.ReadoutSpec`."""
  return get_readout_type(spec).target_size(spec)


def spec_metrics(spec, protocol: str = 'official_ext') -> Tuple[str, ...]:
  """A spec's own `metrics`, or its type's under `protocol`."""
  return (tuple(spec.metrics) or
          get_readout_type(spec).protocol_metrics(protocol))


def primary_metric(spec, protocol: str = 'official_ext') -> str:
  """The primary metric of a spec's type under `protocol`."""
  return get_readout_type(spec).protocol_metrics(protocol)[0]
