"""`python -m official_ext.assemblenet.derive_structure`: step 2 of the one-shot
connectivity search: the edges a search checkpoint learned, pruned at
`--threshold` into a structure and its fixed edge weights (and a PNG of the
graph); docs/assemblenet.md#connectivity-search."""
import dataclasses
import io
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

# configs registers the experiments.
from official_ext.assemblenet import configs  # pylint: disable=unused-import
from official_ext.assemblenet import structures
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.core import output_files
from official_ext.core import tf_internals

# The whole name: optimizer slots are named '<slot>/node_<i>_fusion/...'.
_AGG_WEIGHTS = re.compile(r'^node_(\d+)_fusion/agg_weights(?::0)?$')

KEPT = 'kept'
KEPT_STRONGEST_INPUT = 'kept (strongest input of a node with none kept)'
KEPT_TO_OUTPUT = 'kept (strongest path to the output)'
DROPPED = 'dropped'


def resolve_checkpoint(model_dir: str = '', checkpoint: str = '') -> str:
  """The checkpoint prefix: `checkpoint`, or the newest in `model_dir`
  (`core.checkpoints.resolve_checkpoint`, errors naming the flag)."""
  if bool(model_dir) == bool(checkpoint):
    raise ValueError('Give exactly one of --model_dir and --checkpoint.')
  if checkpoint:
    return checkpoints.resolve_checkpoint(checkpoint, '--checkpoint')
  return checkpoints.resolve_checkpoint(model_dir, '--model_dir')


def edge_weight_logits(checkpoint_path: str) -> Dict[int, np.ndarray]:
  """{node index: float32 logits} of every fusion's `agg_weights`, read from
  the checkpoint's object graph by the variable's full name
  `node_<i>_fusion/agg_weights`, whatever path it is stored under
  (optimizer slots not matched).

  Raises:
    ValueError: naming the checkpoint, when it has no such variable or one
      node twice."""
  reader = tf.train.load_checkpoint(checkpoint_path)
  graph = tf_internals.trackable_object_graph()
  graph.ParseFromString(reader.get_tensor('_CHECKPOINTABLE_OBJECT_GRAPH'))
  out = {}
  for node in graph.nodes:
    for attribute in node.attributes:
      match = _AGG_WEIGHTS.search(attribute.full_name)
      if not match or attribute.name != 'VARIABLE_VALUE':
        continue
      i = int(match.group(1))
      if i in out:
        raise ValueError(f'{checkpoint_path}: two variables for node {i}\'s '
                         f'edge weights ({attribute.full_name}).')
      out[i] = np.asarray(reader.get_tensor(attribute.checkpoint_key),
                          np.float32)
  if not out:
    raise ValueError(f'{checkpoint_path}: no node_<i>_fusion/agg_weights '
                     'variable (not an AssembleNet++lite checkpoint, or a '
                     'structure without multi-input nodes).')
  return out


def learned_edge_weights(structure: Sequence[Sequence[Any]],
                         logits: Dict[int, np.ndarray],
                         where: str = 'the checkpoint'
                         ) -> List[Optional[List[float]]]:
  """Per node: sigmoid(logits) of its inputs (None: stem; [1.0]: one input).

  Raises:
    ValueError: naming the node, when the checkpoint's weights do not fit
      the structure (another structure was trained).
  """
  out = []
  for i, node in enumerate(structure):
    if structures.is_stem(node):
      if i in logits:
        raise ValueError(f'{where} has edge weights for node {i}, a stem in '
                         'the structure: it was trained with another one.')
      out.append(None)
      continue
    n = len(node[1])
    if n == 1:
      if i in logits:
        raise ValueError(f'{where} has edge weights for node {i}, which has '
                         'one input in the structure: it was trained with '
                         'another one.')
      out.append([1.0])
      continue
    if i not in logits or logits[i].shape != (n,):
      got = 'none' if i not in logits else f'shape {list(logits[i].shape)}'
      raise ValueError(f'{where}: node {i} has {n} inputs {node[1]}; its '
                       f'edge weights (node_{i}_fusion/agg_weights) are {got}. '
                       'Was it trained with another structure?')
    out.append([float(x) for x in 1.0 / (1.0 + np.exp(-logits[i]))])
  extra = sorted(set(logits) - set(range(len(structure))))
  if extra:
    raise ValueError(f'{where} has edge weights for nodes {extra}, which the '
                     f'{len(structure)}-node structure lacks.')
  return out


@dataclasses.dataclass
class Derived:
  """What `prune` decided."""
  structure: List[List[Any]]  # Validated; 5-entry block nodes.
  # `[]` for stems and single-input nodes, else `[[w, ...]]` of kept inputs.
  edge_weights: List[Any]
  # Every searched edge: (source, target, weight (1.0 for a node's only
  # input), status: KEPT, KEPT_STRONGEST_INPUT, KEPT_TO_OUTPUT or DROPPED).
  edges: List[Tuple[int, int, float, str]]
  dropped_nodes: List[int]  # Nodes after the output, left out.

  @property
  def num_kept(self) -> int:
    return sum(1 for e in self.edges if e[3] != DROPPED)


def prune(structure: Sequence[Sequence[Any]],
          weights: Sequence[Optional[Sequence[float]]],
          threshold: float, int_filters: bool = False) -> Derived:
  """Drops the edges below `threshold` (in [0, 1]), keeping the graph whole.

  An edge is kept at `weights` >= `threshold` (the post-sigmoid weights of
  `learned_edge_weights`); a block node with no kept input keeps its
  strongest; from the output back to node 0, a node with no kept edge to a
  node that reaches the output keeps its strongest edge to one. Nodes after
  the output are dropped (indices below it unchanged). `int_filters`: the
  structure's block nodes take one int of filters (AssembleNet, AssembleNet++;
  `structures.validate_structure`)."""
  if not 0.0 <= threshold <= 1.0:
    raise ValueError(f'--threshold is a sigmoid weight in [0, 1]; got '
                     f'{threshold}.')
  structure = structures.validate_structure(structure,
                                           int_filters=int_filters)
  output = next(i for i, n in enumerate(structure) if n[0] == 3)
  kept = {}  # (j, i) -> status
  for i, node in enumerate(structure[:output + 1]):
    if structures.is_stem(node):
      continue
    ws = weights[i]
    for j, w in zip(node[1], ws):
      if w >= threshold:
        kept[(j, i)] = KEPT
    if not any((j, i) in kept for j in node[1]):
      k = int(np.argmax(ws))
      kept[(node[1][k], i)] = KEPT_STRONGEST_INPUT
  weight_of = {}
  consumers: Dict[int, List[int]] = {j: [] for j in range(output + 1)}
  for i, node in enumerate(structure[:output + 1]):
    if not structures.is_stem(node):
      for j, w in zip(node[1], weights[i]):
        weight_of[(j, i)] = w
        consumers[j].append(i)
  reaches = {output: True}
  for j in range(output - 1, -1, -1):
    live = [i for i in consumers[j] if reaches.get(i)]
    if any((j, i) in kept for i in live):
      reaches[j] = True
    elif live:
      i = max(live, key=lambda i: weight_of[(j, i)])
      kept[(j, i)] = KEPT_TO_OUTPUT
      reaches[j] = True
    else:
      raise ValueError(f'node {j} feeds no node that reaches the output '
                       f'(node {output}) even in the searched structure; '
                       'remove it from the search space.')
  edges = []
  derived = []
  derived_weights = []
  for i, node in enumerate(structure[:output + 1]):
    if structures.is_stem(node):
      derived.append(list(node))
      derived_weights.append([])
      continue
    ins, ws = [], []
    for j, w in zip(node[1], weights[i]):
      status = kept.get((j, i), DROPPED)
      edges.append((j, i, float(w), status))
      if status != DROPPED:
        ins.append(j)
        ws.append(float(w))
    derived.append([node[0], ins] + list(node[2:5]))
    derived_weights.append([ws] if len(ins) > 1 else [])
  derived = structures.validate_structure(derived, derived_weights,
                                          int_filters=int_filters)
  return Derived(derived, derived_weights, edges,
                 list(range(output + 1, len(structure))))


def _node_label(node: Sequence[Any], i: int) -> str:
  if structures.is_stem(node):
    return {structures.STEM_RGB: 'RGB', structures.STEM_FLOW: 'flow',
            structures.STEM_OBJECT: 'object'}[node[0]] + f'\nnode {i}'
  return f'node {i}\nlevel {node[0]}'


def draw_graph(structure: Sequence[Sequence[Any]],
               edges: Sequence[Tuple[int, int, float, str]],
               path: str, title: str = '') -> Tuple[int, int]:
  """Writes a PNG of the searched graph: stems in the left column, a column
  per level, every edge (`Derived.edges`) with its weight as label, width and
  alpha, kept solid blue, dropped dashed grey; returns (kept, dropped) edges
  drawn."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  columns: Dict[int, List[int]] = {}
  for i, node in enumerate(structure):
    columns.setdefault(-1 if structures.is_stem(node) else node[0],
                       []).append(i)
  pos = {}
  for column, ids in columns.items():
    for r, i in enumerate(ids):
      pos[i] = (column + 1, (len(ids) - 1) / 2.0 - r)
  fig, ax = plt.subplots(figsize=(9, 5), dpi=80)
  kept = dropped = 0
  for j, i, w, status in edges:
    (x0, y0), (x1, y1) = pos[j], pos[i]
    # Edges that skip a column bend (a quadratic curve), so they do not run
    # through the nodes between.
    bend = 0.12 * (x1 - x0 - 1)
    cx, cy = (x0 + x1) / 2 + bend * (y1 - y0), (y0 + y1) / 2 - bend * (x1 - x0)
    t = np.linspace(0.0, 1.0, 32)[:, None]
    curve = ((1 - t) ** 2 * np.array([x0, y0]) + 2 * t * (1 - t) *
             np.array([cx, cy]) + t ** 2 * np.array([x1, y1]))
    if status == DROPPED:
      dropped += 1
      style = dict(color='grey', linestyle='--', linewidth=0.5 + 2 * w,
                   alpha=0.25 + 0.5 * w, zorder=1)
    else:
      kept += 1
      style = dict(color='tab:blue', linestyle='-', linewidth=1 + 3 * w,
                   alpha=0.4 + 0.6 * w, zorder=2)
    ax.plot(curve[:, 0], curve[:, 1], **style)
    # Labels of the edges into one node at staggered points along them.
    x, y = curve[int(31 * (0.3 + 0.12 * (j % 4)))]
    ax.text(x, y, f'{w:.2f}', fontsize=7, ha='center', va='center',
            zorder=4, color='tab:blue' if status != DROPPED else 'dimgrey',
            bbox=dict(boxstyle='round,pad=0.1', fc='white', ec='none',
                      alpha=0.8))
  for i, (x, y) in pos.items():
    stem = structures.is_stem(structure[i])
    ax.scatter([x], [y], s=1400, zorder=3,
               color='tab:orange' if stem else 'lightsteelblue',
               edgecolors='black')
    ax.text(x, y, _node_label(structure[i], i), fontsize=7, ha='center',
            va='center', zorder=5)
  ax.set_xticks(sorted(c + 1 for c in columns))
  ax.set_xticklabels(['stems' if c < 0 else f'level {c}'
                      for c in sorted(columns)])
  ax.set_yticks([])
  ax.margins(y=0.12)
  ax.set_xlim(min(columns) + 0.5, max(columns) + 1.5)
  for side in ('top', 'right', 'left'):
    ax.spines[side].set_visible(False)
  ax.set_title(title or f'{kept} edges kept (solid), {dropped} dropped '
               '(dashed); labels: sigmoid edge weights', fontsize=9)
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', bbox_inches='tight')
  plt.close(fig)
  with tf.io.gfile.GFile(path, 'wb') as f:
    f.write(buffer.getvalue())
  return kept, dropped


def edge_weights_output_path(output: str) -> str:
  stem, _ = os.path.splitext(output)
  return stem + '_edge_weights.json'


def derive(params, checkpoint_path: str, threshold: float, output: str,
           edge_weights_output: str = '', png: str = '') -> Derived:
  """Reads, prunes, logs and writes the structure to `output`, its edge
  weights to `edge_weights_output` ('': `edge_weights_output_path(output)`)
  and, with `png`, the graph.

  Raises:
    ValueError: an output that is an input structure file or lies inside a
      model_dir or SavedModel directory (before the checkpoint is read)."""
  backbone_type = params.task.model.backbone.type
  backbone = params.task.model.backbone.get()
  key = structures.backbone_key(backbone_type)
  int_filters = backbone_type in structures.INT_FILTER_TYPES
  for flag, path in (('--output', output), ('--edge_weights_output',
                                            edge_weights_output or
                                            edge_weights_output_path(output)),
                     ('--png', png)):
    if path:
      output_files.check_output_file(
          path, flag, inputs=[
              (key + 'model_structure_path', backbone.model_structure_path),
              (key + 'model_edge_weights_path',
               backbone.model_edge_weights_path)],
          models=[('--checkpoint', checkpoint_path)], creates_folder=True)
  structure, _ = structures.from_backbone(params.task.model.backbone)
  structure = structures.validate_structure(structure,
                                            int_filters=int_filters)
  weights = learned_edge_weights(structure, edge_weight_logits(
      checkpoint_path), where=checkpoint_path)
  derived = prune(structure, weights, threshold, int_filters=int_filters)
  for i, node in enumerate(structure):
    if structures.is_stem(node):
      continue
    parts = [f'{j}: {w:.3f} {status}' for j, t, w, status in derived.edges
             if t == i]
    logging.info('node %d (level %d) inputs: %s', i, node[0],
                 '; '.join(parts) if parts else 'dropped (after the output)')
  edge_weights_output = edge_weights_output or edge_weights_output_path(
      output)
  for path in (output, edge_weights_output, png):
    if path and os.path.dirname(path):
      tf.io.gfile.makedirs(os.path.dirname(path))
  for path, value in ((output, derived.structure),
                      (edge_weights_output, derived.edge_weights)):
    output_files.write_atomically(
        path, lambda f, v=value: f.write(json.dumps(v) + '\n'))
  if png:
    draw_graph(structure, derived.edges, png)
  return derived


FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  experiment_params.define_model_flags(
      flag_values, ('model_dir', 'checkpoint'),
      experiment='assemblenet_plus_lite_search_demo')
  flags.DEFINE_float('threshold', None, 'Keep the edges whose sigmoid '
                     'weight is >= this.', **define)
  flags.DEFINE_string('output', None, 'The derived structure JSON.', **define)
  flags.DEFINE_string('edge_weights_output', '', 'The kept edge weights '
                      'JSON (default: <output stem>_edge_weights.json).',
                      **define)
  flags.DEFINE_string('png', '', 'A PNG of the graph (optional).', **define)
  flags.mark_flags_as_required(['threshold', 'output'],
                               flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Derives the structure the parsed `flag_values` ask for; prints it."""
  del argv
  fv = flag_values
  checkpoint_path = resolve_checkpoint(fv.model_dir, fv.checkpoint)
  params = experiment_params.params_from_flags(
      fv, model=fv.model_dir or checkpoint_path)
  derived = derive(params, checkpoint_path, fv.threshold, fv.output,
                   fv.edge_weights_output, fv.png)
  weights_path = fv.edge_weights_output or edge_weights_output_path(
      fv.output)
  print(f'{checkpoint_path}: kept {derived.num_kept} of '
        f'{len(derived.edges)} edges at threshold {fv.threshold}; wrote '
        f'{fv.output} and {weights_path}'
        + (f' and {fv.png}' if fv.png else ''))
  print('Train on it: ' + train_override(
      fv.output, weights_path, params.task.model.backbone.type))


def train_override(structure_path: str, edge_weights_path: str,
                   backbone_type: str = 'assemblenet_plus_lite') -> str:
  """The `--params_override` word (as a POSIX shell reads it: double-quoted,
  so the inline structure stays `''`) that trains `backbone_type` on the
  derived files."""
  key = structures.backbone_key(backbone_type)[:-1]
  value = (f"{key}.model_structure='',"
           f'{key}.model_structure_path={structure_path},'
           f'{key}.model_edge_weights_path={edge_weights_path}')
  escaped = re.sub(r'(["$`\\])', r'\\\1', value)
  return f'--params_override="{escaped}"'


if __name__ == '__main__':
  define_flags()
  app.run(main)
