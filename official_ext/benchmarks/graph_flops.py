"""FLOPs counted from a traced TensorFlow graph: the one FLOP counter of the
benchmarks (what it counts: docs/benchmarks.md#how-flops-are-counted)."""
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy
from official_ext.core import tf_internals

MATMULS = ('MatMul', 'BatchMatMul', 'BatchMatMulV2', 'BatchMatMulV3')
EINSUM = 'Einsum'
CONVOLUTIONS = ('Conv2D', 'Conv3D', 'DepthwiseConv2dNative')
INPUT_GRADIENTS = ('Conv2DBackpropInput', 'Conv2DBackpropInputV2',
                   'Conv3DBackpropInput', 'Conv3DBackpropInputV2',
                   'DepthwiseConv2dNativeBackpropInput')
FILTER_GRADIENTS = ('Conv2DBackpropFilter', 'Conv2DBackpropFilterV2',
                    'Conv3DBackpropFilter', 'Conv3DBackpropFilterV2',
                    'DepthwiseConv2dNativeBackpropFilter')
COUNTED = MATMULS + (EINSUM,) + CONVOLUTIONS + INPUT_GRADIENTS + (
    FILTER_GRADIENTS)
CALLS = ('PartitionedCall', 'StatefulPartitionedCall')
WHILE_OPS = ('While', 'StatelessWhile')
IF_OPS = ('If', 'StatelessIf')


def _not_counted(op_type: str) -> bool:
  """A convolution this counter does not read (fused, quantized, the generic
  'Conv'): an error, never a zero."""
  return op_type not in COUNTED and (
      op_type == 'Conv' or 'Conv2D' in op_type or 'Conv3D' in op_type or
      'DepthwiseConv' in op_type)


class _Op:
  """What the count reads of an op: type, name, attributes, static shapes."""

  def __init__(self, op_type: str, name: str, attr: Callable[..., Any],
               num_inputs: int, input_shape: Callable[[int], Any],
               output_shape: Callable[[int], Any]):
    self.type, self.name, self.attr = op_type, name, attr
    self.num_inputs = num_inputs
    self.input_shape, self.output_shape = input_shape, output_shape


def _from_operation(op) -> _Op:
  def attr(key, default=None):
    try:
      return op.get_attr(key)
    except ValueError:
      return default

  def dims(tensor):
    return tensor.shape.as_list() if tensor.shape.rank is not None else None

  return _Op(op.type, op.name, attr, len(op.inputs),
             lambda i: dims(op.inputs[i]), lambda i: dims(op.outputs[i]))


def _proto_dims(shape) -> Optional[List[Optional[int]]]:
  if shape.unknown_rank:
    return None
  return [d.size if d.size >= 0 else None for d in shape.dim]


def _from_node(node, shape_of: Callable[[str], Any]) -> _Op:
  """A NodeDef of a function, its shapes as `as_graph_def(add_shapes=True)`
  recorded them."""
  def attr(key, default=None):
    if key not in node.attr:
      return default
    value = node.attr[key]
    return getattr(value, value.WhichOneof('value'))

  inputs = [i for i in node.input if not i.startswith('^')]
  outputs = [_proto_dims(s) for s in node.attr['_output_shapes'].list.shape]
  return _Op(node.op, node.name, attr, len(inputs),
             lambda i: shape_of(inputs[i]),
             lambda i: outputs[i] if i < len(outputs) else None)


def _dims(op: _Op, dims) -> list:
  if dims is None or any(d is None for d in dims):
    raise ValueError(
        f'graph_flops: {op.type} op {op.name!r} has a tensor of unknown '
        f'shape {dims}: trace with static shapes (a fixed batch; a nested '
        'function keeps the shapes it was first traced with, e.g. those of a '
        'model built for any batch).')
  return dims


def _size(dims) -> int:
  return int(np.prod(dims, dtype=np.int64))


def _positions(op: _Op, dims) -> int:
  """Elements of a convolution's input or output tensor per channel."""
  data_format = op.attr('data_format', b'NHWC')
  if isinstance(data_format, bytes):
    data_format = data_format.decode()
  return _size(dims) // dims[1 if data_format.startswith('NC') else -1]


def _flops(op: _Op) -> int:
  """2 x the multiply-adds of one counted op."""
  if op.type == 'MatMul':
    a = _dims(op, op.input_shape(0))
    k = a[0] if op.attr('transpose_a', False) else a[1]
    return 2 * _size(_dims(op, op.output_shape(0))) * k
  if op.type in MATMULS:  # [..., m, k] x [..., k, n] (adj_x: [..., k, m]).
    a = _dims(op, op.input_shape(0))
    k = a[-2] if op.attr('adj_x', False) else a[-1]
    return 2 * _size(_dims(op, op.output_shape(0))) * k
  if op.type == EINSUM:
    equation = op.attr('equation', b'')
    equation = equation.decode() if isinstance(equation, bytes) else equation
    terms = equation.partition('->')[0].split(',')
    if '.' in equation or len(terms) != 2 or op.num_inputs != 2:
      raise ValueError(f'graph_flops: Einsum op {op.name!r}: cannot count '
                       f'{equation!r} (two operands without an ellipsis only).')
    sizes = {}
    for i, term in enumerate(terms):
      dims = _dims(op, op.input_shape(i))
      if len(term) != len(dims):
        raise ValueError(f'graph_flops: Einsum op {op.name!r}: {term!r} does '
                         f'not match the operand shape {dims}.')
      sizes.update(zip(term, dims))
    # Every index, contracted or kept, is one loop of multiply-adds.
    return 2 * _size(list(sizes.values()))
  # Convolutions: each output position (per channel) x the whole filter.
  if op.type in CONVOLUTIONS:
    return 2 * _positions(op, _dims(op, op.output_shape(0))) * _size(
        _dims(op, op.input_shape(1)))
  gradient = _dims(op, op.input_shape(2))  # The output's gradient.
  if op.type in INPUT_GRADIENTS:
    return 2 * _positions(op, gradient) * _size(_dims(op, op.input_shape(1)))
  return 2 * _positions(op, gradient) * _size(_dims(op, op.output_shape(0)))


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


def _refuse_if_contracting(op_type: str, op_name: str, called: list,
                           library) -> None:
  """Raises if a function an op calls (directly or through others) holds a
  contraction: loops and conditionals inside a nested function are not
  followed."""
  todo, seen = list(called), set()
  while todo:
    name = todo.pop()
    if name in seen or name not in library:
      continue
    seen.add(name)
    ops = sorted({n.op for n in library[name].node_def
                  if n.op in COUNTED or _not_counted(n.op)})
    if ops:
      raise ValueError(
          f'graph_flops: the function {name!r} called by {op_type} op '
          f'{op_name!r} holds {ops}, which this counter does not follow '
          'there (a loop or conditional inside a nested function).')
    for node in library[name].node_def:
      todo.extend(_called(node))


def _add_function(name: str, caller: str, times: int,
                  totals: Dict[str, int], library) -> None:
  """Adds `times` x the contractions of the library function `name` (a
  nested `tf.function`), read from the shapes it was traced with."""
  if name not in library:
    raise ValueError(f'graph_flops: {caller!r} calls {name!r}, which is not '
                     "in the graph's function library.")
  function = library[name]
  args = [a.name for a in function.signature.input_arg]
  arg_shapes = [_proto_dims(s)
                for s in function.attr['_input_shapes'].list.shape]
  nodes = {n.name: n for n in function.node_def}

  def shape_of(ref: str):
    parts = ref.split(':')
    if len(parts) == 1:
      i = args.index(ref)
      return arg_shapes[i] if i < len(arg_shapes) else None
    shapes = nodes[parts[0]].attr['_output_shapes'].list.shape
    if len(shapes) != 1 or parts[-1] != '0':
      raise ValueError(f'graph_flops: function {name!r}: cannot tell the '
                       f'shape of {ref!r} (an op of several outputs).')
    return _proto_dims(shapes[0])

  todo = [r.split(':')[0] for r in function.ret.values()] + list(
      function.control_ret.values())
  live = set()
  while todo:
    node = todo.pop()
    if node in live or node not in nodes:
      continue
    live.add(node)
    todo.extend(i.lstrip('^').split(':')[0] for i in nodes[node].input)
  for node in function.node_def:
    if node.name not in live:
      continue
    if node.op in COUNTED:
      flops = _flops(_from_node(node, shape_of))
      totals[node.op] = totals.get(node.op, 0) + times * flops
    elif _not_counted(node.op):
      raise ValueError(f'graph_flops: {node.op} op {node.name!r} in function '
                       f'{name!r}: not counted by this counter.')
    elif node.op in CALLS:
      _add_function(node.attr['f'].func.name, node.name, times, totals,
                    library)
    else:
      _refuse_if_contracting(node.op, node.name, _called(node), library)


def _live(graph) -> set:
  """The names of the ops that the outputs of `graph` (a function's graph)
  and its control outputs depend on: the ops that run."""
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
  """The number of iterations of While op `op` where the trace fixes it: a
  static `maximum_iterations`, or a counter from a static start, adding 1,
  run to a static bound (the smaller of the two); else None."""
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
  """Adds `times` x the contractions of `graph` (and of the loops,
  conditionals and nested functions in it) to `totals`; `loops` collects
  each While op's number of iterations."""
  live = _live(graph)
  for op in graph.get_operations():
    if op.name not in live:
      continue  # Its value is never used: pruned when the graph runs.
    if op.type in COUNTED:
      totals[op.type] = totals.get(op.type, 0) + times * _flops(
          _from_operation(op))
      continue
    if _not_counted(op.type):
      raise ValueError(f'graph_flops: {op.type} op {op.name!r}: not counted '
                       'by this counter.')
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
    elif op.type in CALLS:
      _add_function(_called(op, ('f',))[0], op.name, times, totals, library)
    else:
      _refuse_if_contracting(op.type, op.name, _called(op), library)


def graph_flops(graph: tf.Graph) -> Dict[str, int]:
  """FLOPs (multiply-add = 2) of the contractions of `graph`, by op type.

  Args:
    graph: a traced graph (`tf.function(...).get_concrete_function().graph`)
      with static shapes.

  Raises:
    ValueError: naming an op or function it cannot count.
  """
  library = {f.signature.name: f for f in
             graph.as_graph_def(add_shapes=True).library.function}
  totals: Dict[str, int] = {}
  _add(graph, 1, totals, library, {})
  return totals


def function_flops(fn: Callable[[], Any]) -> int:
  """FLOPs of the contractions of `fn` (no arguments), traced once."""
  graph = tf.function(fn).get_concrete_function().graph
  return sum(graph_flops(graph).values())


def forward_flops(model: tf_keras.Model, features: Any) -> int:
  """FLOPs of `model(features, training=False)` with the stock ops."""
  with kernel_policy.use(kernel_policy.resolve('stock')):
    return function_flops(lambda: model(features, training=False))


def step_flops(task, model: tf_keras.Model, batch: Any,
               training: bool = True) -> int:
  """FLOPs of `task.train_step` (or `validation_step`) on `batch`.

  Traced, not run: the stock ops (no CPU fast path), without XLA (a
  `jit_compile` task config is off while it traces) and, for training,
  plain SGD, whose update holds no contraction.
  """
  config = task.task_config
  jit_compile = getattr(config, 'jit_compile', None)
  if jit_compile is not None:
    config.jit_compile = False
  metrics = task.build_metrics(training=training)
  if training:
    sgd = tf_keras.optimizers.legacy.SGD(0.0)
    fn = lambda: task.train_step(batch, model, sgd, metrics)
  else:
    fn = lambda: task.validation_step(batch, model, metrics)
  try:
    with kernel_policy.use(kernel_policy.resolve('stock')):
      return function_flops(fn)
  finally:
    if jit_compile is not None:
      config.jit_compile = jit_compile


def train_step_flops(task, model: tf_keras.Model, batch: Any) -> float:
  """`step_flops` of a training step per example (the labels' first
  dimension; `batch` is a dict with 'labels' or a (features, labels) pair)."""
  labels = batch['labels'] if isinstance(batch, dict) else batch[1]
  return step_flops(task, model, batch) / int(labels.shape[0])
