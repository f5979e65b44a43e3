"""Gradient checkpointing of AssembleNet++lite segments (stems, fusions, block
groups): `recompute_grad`, and the batch norm that updates its moving
statistics once per step although a segment runs twice.

The backward pass reruns a checkpointed segment in training mode, and its
batch norms must not update their moving statistics a second time in that
rerun: `in_recomputation` marks the rerun, and `BatchNormalization` (every
batch norm of the model) skips its update there.
"""
import threading
from typing import Any, Callable, List

import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy
from official_ext.core import tf_internals


_RECOMPUTATION = threading.local()


def in_recomputation() -> bool:
  """True while this thread reruns a `recompute_grad` segment for gradients.

  The flag is per thread: `MirroredStrategy` runs each replica (and its
  backward pass) in a thread of its own. It is read when a layer is called,
  so it holds in eager mode and while a `tf.function` (with or without XLA)
  is traced alike.
  """
  return getattr(_RECOMPUTATION, 'depth', 0) > 0


def recompute_grad(forward: Callable[..., Any]) -> Callable[..., Any]:
  """Gradient checkpointing of `forward`, like `tf.recompute_grad`, with

  a backward rerun that updates no state and one segment's rerun at a time.

  The forward pass runs `forward` once (the tape keeps only its inputs); the
  backward pass runs it again, on the same inputs and variables, and takes
  the gradients of that rerun. The batch norms in `forward` run in training
  mode both times; the first run updates their moving statistics, the rerun
  (marked by `in_recomputation`) does not (`BatchNormalization.add_update`),
  so a step decays them by `bn_decay` once, as without recomputation, and the
  rerun gives the same outputs and gradients as the first run.

  In a graph (`tf.function`), a segment's rerun starts when its output
  gradients exist and the previous segment's backward pass (the one whose
  gradient the tape built before this one's) has produced its gradients
  (control dependencies). Without that order the executor runs the backward
  passes of independent segments (the two level-0 block groups, the two
  level-2 block groups) at the same time, each holding all its recomputed
  activations: at 8 x 32 x 224^2 the two level-0 block groups' reruns
  together hold about 4 GB of the step's 9 GB live-tensor peak, and running
  the reruns in order lowers the step's peak host memory by about a third.
  The tape builds a gradient only after every gradient that feeds it, so
  the order adds no cycle. Unlike `tf.recompute_grad`, the rerun's inputs
  are not copied (`tf.recompute_grad` adds 0 to every input, a data
  dependency for XLA, which ignores control dependencies), and inputs no
  tape watches (the RGB stem's clip) get no gradient. The gradients are
  those of `tf.recompute_grad`.

  The ordered rerun is a CPU fast path (`core.kernels.kernel_policy`,
  'assemblenet.ordered_recompute', measured for host memory): where the
  kernel policy does not take it, and inside an XLA-compiled function
  (which ignores control dependencies), the segment runs through
  `tf.recompute_grad`, its rerun still marked by `in_recomputation`.

  `forward` must otherwise be deterministic: a random op (dropout) would
  draw a different mask in the rerun than in the forward pass and give wrong
  gradients. No segment checkpointed here has one (the head's dropout is not
  checkpointed).

  Args:
    forward: f(*tensors) -> tensor or nest of tensors.

  Returns:
    A function with the signature and outputs of `forward`.
  """

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
  """tf_keras `BatchNormalization` that skips its moving-statistics update
  while a `recompute_grad` segment is rerun (`in_recomputation`).

  Otherwise identical (same variables, same `synchronized` option); the
  normalization itself (batch statistics in training mode, cross-replica
  ones when synchronized) is computed in the rerun as in the forward pass.
  """

  def add_update(self, updates):
    if in_recomputation():
      return  # The forward run of this step made this update already.
    super().add_update(updates)
