"""Analytic FLOPs counted from a traced TensorFlow graph's matmul shapes.

`graph_flops(graph)` adds up the multiply-adds (2 FLOPs each) of the
contractions of a `tf.Graph` (a traced `tf.function`'s): MatMul,
BatchMatMul (V1-V3) and two-operand Einsum, read from the static shapes of
their operands. Element-wise work, reductions and the optimizer's update are
not counted (they are memory-bound, and the hand-written formulas of the
benchmarks leave them out too). `train_step_flops` traces a task's training
step on a batch (forward pass, losses and the gradients the step computes:
TensorFlow computes no gradient with respect to an input that nothing
trains, so neither does the count) and divides by the batch size.

Contract: the count is exact for the ops it counts, or an error. A counted
op with an unknown dimension, an Einsum it cannot read (an ellipsis, one or
three operands), a convolution (not counted here: `assemblenet/modeling/
complexity.py` counts AssembleNet's), or a contraction inside a function
the graph calls (a nested `tf.function`, a `tf.cond` branch, a loop body,
whose shapes the graph does not hold) raises a ValueError naming the op or
function; a count is never silently low.
"""
from typing import Any, Callable, Dict

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.core import kernel_policy

MATMULS = ('MatMul', 'BatchMatMul', 'BatchMatMulV2', 'BatchMatMulV3')
EINSUM = 'Einsum'
COUNTED = MATMULS + (EINSUM,)
# Contractions this counter does not read: an error, never a zero.
NOT_COUNTED = ('Conv2D', 'Conv3D', 'Conv2DBackpropInput',
               'Conv2DBackpropFilter', 'Conv3DBackpropInputV2',
               'Conv3DBackpropFilterV2', 'DepthwiseConv2dNative',
               'DepthwiseConv2dNativeBackpropInput',
               'DepthwiseConv2dNativeBackpropFilter')


def _dims(op, tensor) -> list:
  """The static shape of `tensor` (an input or output of `op`)."""
  dims = tensor.shape.as_list() if tensor.shape.rank is not None else None
  if dims is None or any(d is None for d in dims):
    raise ValueError(
        f'graph_flops: {op.type} op {op.name!r} has a tensor of unknown '
        f'shape {tensor.shape}: trace with static shapes (a fixed batch).')
  return dims


def _matmul_flops(op) -> int:
  a = _dims(op, op.inputs[0])
  out = _dims(op, op.outputs[0])
  if op.type == 'MatMul':
    k = a[0] if op.get_attr('transpose_a') else a[1]
  else:  # BatchMatMul*: [..., m, k] x [..., k, n] (adj_x: [..., k, m]).
    k = a[-2] if op.get_attr('adj_x') else a[-1]
  return 2 * int(np.prod(out, dtype=np.int64)) * k


def _einsum_flops(op) -> int:
  equation = op.get_attr('equation').decode()
  inputs, _, _ = equation.partition('->')
  terms = inputs.split(',')
  if '.' in equation or len(terms) != 2 or len(op.inputs) != 2:
    raise ValueError(f'graph_flops: Einsum op {op.name!r}: cannot count '
                     f'{equation!r} (two operands without an ellipsis only).')
  sizes = {}
  for term, tensor in zip(terms, op.inputs):
    dims = _dims(op, tensor)
    if len(term) != len(dims):
      raise ValueError(f'graph_flops: Einsum op {op.name!r}: {term!r} does '
                       f'not match the operand shape {dims}.')
    sizes.update(zip(term, dims))
  # Every index, contracted or kept, is one loop of multiply-adds.
  return 2 * int(np.prod(list(sizes.values()), dtype=np.int64))


def _check_functions(graph: tf.Graph) -> None:
  """Raises if a function the graph calls holds a contraction."""
  for function in graph.as_graph_def().library.function:
    ops = sorted({n.op for n in function.node_def} &
                 set(COUNTED + NOT_COUNTED))
    if ops:
      raise ValueError(
          f'graph_flops: the function {function.signature.name!r} called by '
          f'the graph holds {ops}, whose shapes the graph does not record: '
          'trace without nested tf.functions, conditionals or loops around '
          'them (e.g. jit_compile off).')


def graph_flops(graph: tf.Graph) -> Dict[str, int]:
  """FLOPs of the contractions of `graph`, by op type.

  Args:
    graph: a traced graph (`tf.function(...).get_concrete_function().graph`)
      with static shapes.

  Returns:
    {op type: FLOPs (multiply-add = 2)} for each counted type present
    (`COUNTED`).

  Raises:
    ValueError: an op it cannot count (see the module docstring), naming it.
  """
  _check_functions(graph)
  totals: Dict[str, int] = {}
  for op in graph.get_operations():
    if op.type in NOT_COUNTED:
      raise ValueError(f'graph_flops: {op.type} op {op.name!r}: '
                       'convolutions are not counted by this counter.')
    if op.type in MATMULS:
      flops = _matmul_flops(op)
    elif op.type == EINSUM:
      flops = _einsum_flops(op)
    else:
      continue
    totals[op.type] = totals.get(op.type, 0) + flops
  return totals


def function_flops(fn: Callable[[], Any]) -> int:
  """FLOPs of the contractions of `fn` (no arguments), traced once."""
  graph = tf.function(fn).get_concrete_function().graph
  return sum(graph_flops(graph).values())


def train_step_flops(task, model: tf_keras.Model,
                     batch: Dict[str, tf.Tensor]) -> float:
  """FLOPs per example of `task.train_step` on `batch` (traced, not run).

  The step is traced with the stock ops (kernel policy 'stock': the model's
  computation, not a CPU fast path's matrix-vector batch-norm sums), without
  XLA (`task.task_config.jit_compile` is False while it traces: the
  compiled function's body is a nested function) and with plain SGD, whose
  update holds no contraction.

  Args:
    task: a task with `train_step(inputs, model, optimizer, metrics)` and
      `build_metrics`, and `task_config.jit_compile` (YT8M's).
    model: its built model.
    batch: a training batch of static shapes; its 'labels' give the batch
      size (first dimension).

  Returns:
    FLOPs per example (multiply-add = 2).
  """
  jit_compile = task.task_config.jit_compile
  task.task_config.jit_compile = False
  optimizer = tf_keras.optimizers.legacy.SGD(0.0)
  metrics = task.build_metrics(training=True)
  try:
    with kernel_policy.use(kernel_policy.resolve('stock')):
      flops = function_flops(
          lambda: task.train_step(batch, model, optimizer, metrics))
  finally:
    task.task_config.jit_compile = jit_compile
  return flops / int(batch['labels'].shape[0])

