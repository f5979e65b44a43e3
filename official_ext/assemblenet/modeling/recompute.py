"""Gradient checkpointing of AssembleNet++lite segments (stems, fusions, block
groups): `recompute_grad`, and the batch norm that updates its moving
statistics once per step although a segment runs twice (its rerun is marked
by `in_recomputation`)."""
import threading
from typing import Any, Callable, List

import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy
from official_ext.core import tf_internals


_RECOMPUTATION = threading.local()


def in_recomputation() -> bool:
  """True while this thread reruns a `recompute_grad` segment for gradients
  (per thread: `MirroredStrategy` runs each replica in one of its own; read
  when a layer is called, eagerly or while tracing)."""
  return getattr(_RECOMPUTATION, 'depth', 0) > 0


def recompute_grad(forward: Callable[..., Any]) -> Callable[..., Any]:
  """Gradient checkpointing of `forward`, like `tf.recompute_grad`, with a
  backward rerun that updates no state and one segment's rerun at a time.

  The forward pass runs `forward` once (the tape keeps only its inputs); the
  backward pass reruns it on the same inputs and variables, marked by
  `in_recomputation` (its batch norms do not update their moving statistics
  again), and takes that rerun's gradients: those of `tf.recompute_grad`. In
  a graph, a segment's rerun waits for its output gradients and for the
  gradients of the segment whose backward pass was built before it (control
  dependencies), so that independent segments never hold their recomputed
  activations at once; the inputs are not copied and an input no tape
  watches gets no gradient. This ordered rerun is a CPU fast path
  ('assemblenet.ordered_recompute'); elsewhere, and inside XLA (which
  ignores control dependencies), the segment runs through
  `tf.recompute_grad`. `forward` must be deterministic (no dropout).

  Args:
    forward: f(*tensors) -> tensor or nest of tensors.

  Returns:
    A function with the signature and outputs of `forward`."""

  def rerun(*args):
    _RECOMPUTATION.depth = getattr(_RECOMPUTATION, 'depth', 0) + 1
    try:
      return forward(*args)
    finally:
      _RECOMPUTATION.depth -= 1

  @tf.custom_gradient
  def segment(*args):
    # Inputs no tape watches (the clip of the RGB stem) get no gradient:
    # one in the order's token would keep the executor from pruning it.
    needed = [tf_internals.should_record_backprop([a]) for a in args]
    with tf_internals.stop_recording():
      result = forward(*args)

    def grad(*dys, variables=None):
      variables = list(variables or [])
      waits = [d for d in dys if d is not None] + _previous_backward()
      with tf.control_dependencies(waits):
        xs = [tf.identity(a) for a in args]
      with tf.GradientTape() as tape:
        tape.watch(xs)
        tape.watch(variables)
        outputs = tf.nest.flatten(rerun(*xs))
      sources = [x for x, n in zip(xs, needed) if n] + variables
      grads = iter(tape.gradient(
          outputs, sources, output_gradients=list(dys),
          unconnected_gradients=tf.UnconnectedGradients.ZERO))
      input_grads = [next(grads) if n else None for n in needed]
      variable_grads = list(grads)
      _BACKWARD_ORDER.last = (tf.compat.v1.get_default_graph(), [
          g for g in input_grads + variable_grads if g is not None])
      return input_grads, variable_grads

    return result, grad

  def call(*args):
    if (not kernel_policy.current().takes('assemblenet.ordered_recompute') or
        (not tf.executing_eagerly() and
         tf_internals.in_xla_context(tf.compat.v1.get_default_graph()))):
      runs = []

      def run(*xs):  # First call: the forward pass; later: reruns.
        if not runs:
          runs.append(True)
          return forward(*xs)
        return rerun(*xs)
      return tf.recompute_grad(run)(*args)
    return segment(*args)

  return call


# Per thread (a replica builds its backward pass in a thread of its own):
# (graph, gradients) of the segment whose backward pass was built last.
_BACKWARD_ORDER = threading.local()


def _previous_backward() -> List[tf.Tensor]:
  """The last-built segment's gradients, where they are in this graph."""
  if tf.executing_eagerly():  # Op by op: one segment at a time anyway.
    return []
  graph, grads = getattr(_BACKWARD_ORDER, 'last', (None, ()))
  if graph is not tf.compat.v1.get_default_graph():
    return []
  return [g for g in grads if g is not None]


class BatchNormalization(tf_keras.layers.BatchNormalization):
  """`tf_keras.layers.BatchNormalization` that skips its moving-statistics
  update while a `recompute_grad` segment is rerun; otherwise identical."""

  def add_update(self, updates):
    if in_recomputation():
      return  # The forward run of this step made this update already.
    super().add_update(updates)
