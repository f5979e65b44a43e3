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

Only ops whose values are used count (those the function's outputs and
control outputs depend on: what runs). Loops and conditionals are followed into the graphs `tf.while_loop` and
`tf.cond` traced (`core.tf_internals.control_flow_graphs`): a loop body
counts times its number of iterations where the trace fixes it: a static
`maximum_iterations`, or a counter from a static start to a static bound (a
Keras RNN, e.g. the starter's LSTM: one iteration per frame; its gradient
loop runs as often as the forward loop did); a conditional counts once when
its branches hold the same contractions.

Contract: the count is exact for the ops it counts, or an error. A counted
op with an unknown dimension, an Einsum it cannot read (an ellipsis, one or
three operands), a convolution (not counted here: `assemblenet/modeling/
complexity.py` counts AssembleNet's), a loop holding contractions whose
number of iterations the trace does not fix, a conditional whose branches differ, or a
contraction inside a function called otherwise (a nested `tf.function`,
whose shapes the graph does not hold) raises a ValueError naming the op or
function; a count is never silently low.
"""
from typing import Any, Callable, Dict

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy
from official_ext.core import tf_internals

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


WHILE_OPS = ('While', 'StatelessWhile')
IF_OPS = ('If', 'StatelessIf')


def _called(node, attr_names=('f', 'body', 'cond', 'then_branch',
                              'else_branch')) -> list:
  """The names of the functions an op (or a NodeDef) calls."""
  names = []
  for name in attr_names:
    try:
      value = node.get_attr(name) if hasattr(node, 'get_attr') else (
          node.attr[name].func if name in node.attr else None)
    except ValueError:
      continue
    if value is not None and getattr(value, 'name', ''):
      names.append(value.name)
  return names


def _refuse_if_contracting(op, library) -> None:
  """Raises if a function `op` calls (directly or through others) holds a
  contraction, whose shapes the graph does not record."""
  todo, seen = _called(op), set()
  while todo:
    name = todo.pop()
    if name in seen or name not in library:
      continue
    seen.add(name)
    ops = sorted({n.op for n in library[name].node_def} &
                 set(COUNTED + NOT_COUNTED))
    if ops:
      raise ValueError(
          f'graph_flops: the function {name!r} called by {op.type} op '
          f'{op.name!r} holds {ops}, whose shapes the graph does not record: '
          'trace without nested tf.functions around them (e.g. jit_compile '
          'off).')
    for node in library[name].node_def:
      todo.extend(_called(node))


def _live(graph) -> set:
  """The names of the ops that the outputs of `graph` (a function's graph)
  and its control outputs (e.g. variable updates) depend on: the ops that
  run. (Keras' RNN, for one, traces a step outside its loop only to learn
  the output's shape.)"""
  todo = [t.op for t in graph.outputs] + list(
      getattr(graph, 'control_outputs', []))
  live = set()
  while todo:
    op = todo.pop()
    if op.name in live:
      continue
    live.add(op.name)
    todo.extend(t.op for t in op.inputs)
    todo.extend(op.control_inputs)
  return live


def _unwrap(tensor):
  while tensor.op.type == 'Identity':
    tensor = tensor.op.inputs[0]
  return tensor


def _static(tensor, loops: Dict[str, int]):
  """`tensor`'s value where the trace fixes it, else None: a constant, a
  slice of a static shape, or a counted loop's counter output (output 0 of
  a While op: its number of iterations)."""
  value = tf.get_static_value(tensor)
  if value is not None:
    return value
  op = tensor.op
  if op.type in WHILE_OPS and tensor.value_index == 0 and op.name in loops:
    return loops[op.name]
  if op.type == 'StridedSlice' and op.get_attr('shrink_axis_mask') == 1:
    base = tf.get_static_value(op.inputs[0])
    source = op.inputs[0].op
    if (base is None and source.type == 'Shape' and
        source.inputs[0].shape.is_fully_defined()):
      base = np.array(source.inputs[0].shape.as_list())
    begin = tf.get_static_value(op.inputs[1])
    if base is not None and begin is not None and len(begin) == 1:
      return int(base[int(begin[0])])
  return None


def _trips(op, graphs, loops: Dict[str, int]):
  """The number of iterations of While op `op`, where the trace fixes it:
  its static `maximum_iterations` (input 1; -1: none), or the bound of a
  condition `counter < bound` whose counter starts static and whose body
  adds 1 to it, the bound static (or a loop variable the body passes on
  unchanged), whichever is smaller; else None."""
  bounds = []
  maximum = tf.get_static_value(op.inputs[1])
  if maximum is not None and int(maximum) >= 0:
    bounds.append(int(maximum))
  cond, body = graphs['cond'], graphs['body']
  less = _unwrap(cond.outputs[0]).op
  if less.type == 'Less':
    cond_inputs = [id(t) for t in cond.inputs]
    captured = {id(inner): outer for outer, inner in cond.captures}

    def outer_value(tensor, must_not_change: bool):
      if id(tensor) in cond_inputs:
        i = cond_inputs.index(id(tensor))
        if must_not_change and (
            _unwrap(body.outputs[i]) is not body.inputs[i]):
          return None
        return i, _static(op.inputs[i], loops)
      if id(tensor) in captured:
        return None, _static(captured[id(tensor)], loops)
      return None, tf.get_static_value(tensor)

    counter = outer_value(less.inputs[0], False)
    bound = outer_value(less.inputs[1], True)
    if counter and bound and counter[0] is not None and (
        counter[1] is not None and bound[1] is not None):
      step = _unwrap(body.outputs[counter[0]]).op
      if step.type in ('AddV2', 'Add') and (
          step.inputs[0] is body.inputs[counter[0]] and
          tf.get_static_value(step.inputs[1]) == 1):
        bounds.append(max(0, int(bound[1]) - int(counter[1])))
  return min(bounds) if bounds else None


def _add(graph: tf.Graph, times: int, totals: Dict[str, int],
         library, loops: Dict[str, int]) -> None:
  """Adds `times` x the contractions of `graph` (and of the loops and
  conditionals in it) to `totals`; `loops` collects each While op's number
  of iterations."""
  live = _live(graph)
  for op in graph.get_operations():
    if op.name not in live:
      continue  # Its value is never used: pruned when the graph runs.
    if op.type in NOT_COUNTED:
      raise ValueError(f'graph_flops: {op.type} op {op.name!r}: '
                       'convolutions are not counted by this counter.')
    if op.type in MATMULS or op.type == EINSUM:
      flops = _matmul_flops(op) if op.type in MATMULS else _einsum_flops(op)
      totals[op.type] = totals.get(op.type, 0) + times * flops
      continue
    graphs = tf_internals.control_flow_graphs(op)
    if op.type in WHILE_OPS and graphs:
      body: Dict[str, int] = {}
      _add(graphs['body'], 1, body, library, loops)
      _add(graphs['cond'], 1, body, library, loops)
      trips = _trips(op, graphs, loops)
      if trips is not None:
        loops[op.name] = trips
      if not body:
        continue
      if trips is None:
        raise ValueError(
            f'graph_flops: {op.type} op {op.name!r} holds {sorted(body)} but '
            'its number of iterations is not static (neither a static '
            'maximum_iterations nor a counter run to a static bound).')
      for key, value in body.items():
        totals[key] = totals.get(key, 0) + times * int(trips) * value
    elif op.type in IF_OPS and graphs:
      branches = []
      for key in ('then', 'else'):
        branch: Dict[str, int] = {}
        _add(graphs[key], 1, branch, library, loops)
        branches.append(branch)
      if branches[0] != branches[1]:
        raise ValueError(
            f'graph_flops: {op.type} op {op.name!r}: its branches hold '
            f'different contractions ({branches[0]} and {branches[1]}); '
            'which one runs is not known before the step runs.')
      for key, value in branches[0].items():
        totals[key] = totals.get(key, 0) + times * value
    else:
      _refuse_if_contracting(op, library)


def graph_flops(graph: tf.Graph) -> Dict[str, int]:
  """FLOPs of the contractions of `graph`, by op type.

  Loops (`tf.while_loop`, Keras' RNNs and their gradients) count their
  body times their number of iterations, where the trace fixes it
  (`_trips`); a conditional counts its branches once when both hold the
  same contractions.

  Args:
    graph: a traced graph (`tf.function(...).get_concrete_function().graph`)
      with static shapes.

  Returns:
    {op type: FLOPs (multiply-add = 2)} for each counted type present
    (`COUNTED`).

  Raises:
    ValueError: an op it cannot count (see the module docstring), naming it.
  """
  library = {f.signature.name: f
             for f in graph.as_graph_def().library.function}
  totals: Dict[str, int] = {}
  _add(graph, 1, totals, library, {})
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

