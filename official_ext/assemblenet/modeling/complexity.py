"""Analytic parameter and FLOP counts of AssembleNet++lite, from a structure.

Written independently of the layers (from the architecture's description), so
that tests can check the built model against it and the benchmark can report
FLOPs without a profiler.

Parameters counted: conv kernels (no biases), batch-norm gamma and beta,
dense kernels and biases, trainable edge weights (when none are given),
peer-attention softmax weights. Not counted (non-trainable): given edge
weights, batch-norm moving statistics, representation-flow kernels and
hyper-parameters (trainable only on request).

FLOPs: 2 x multiply-accumulates of the convolutions and dense layers (the
usual convention); batch norm, activations, pooling, fusion arithmetic and
the representation flow are not included.
"""
import dataclasses
import math
from typing import Any, List, Optional, Sequence

from official_ext.assemblenet import structures


@dataclasses.dataclass
class Complexity:
  params: int
  flops: int
  node_shapes: List[tuple]  # (H, W, C) of every node
  fusion_widths: List[Optional[int]]


def analyze(structure: Any = None,
            blocks_per_level: Sequence[int] = (
                structures.ASSEMBLENET_PLUS_LITE_BLOCKS_PER_LEVEL),
            edge_weights_given: bool = True,
            attention_mode: Optional[str] = 'peer',
            fusion_width_as_channels: bool = False,
            num_frames: int = 32, height: int = 224, width: int = 224,
            num_classes: int = 157, stem_filters: int = 24,
            head_filters: Sequence[int] = (432, 2048),
            max_pool_predictions: bool = False) -> Complexity:
  """Counts trainable parameters and forward FLOPs of one clip."""
  structure = structures.validate_structure(
      structure if structure is not None else
      structures.ASSEMBLENET_PLUS_LITE_STRUCTURE)
  t = num_frames
  params = 0
  macs = 0

  def conv(k, cin, cout, h, w):
    nonlocal params, macs
    params += k * cin * cout
    macs += k * cin * cout * t * h * w

  def bn(c):
    nonlocal params
    params += 2 * c

  def dense(cin, cout, positions):
    nonlocal params, macs
    params += cin * cout + cout
    macs += cin * cout * positions

  shapes = []
  widths = []
  for node in structure:
    if node[0] < 0:
      cin = 3 if node[0] == structures.STEM_RGB else 2
      h, w = math.ceil(height / 2), math.ceil(width / 2)
      conv(9, cin, stem_filters, h, w)
      bn(stem_filters)
      conv(3, stem_filters, stem_filters, h, w)
      bn(stem_filters)
      shapes.append((h, w, stem_filters))
      widths.append(None)
      continue
    level, inputs, (fa, fb, fo), _, stride = node
    ins = [shapes[j] for j in inputs]
    h = min(s[0] for s in ins)
    w = min(s[1] for s in ins)
    chans = [s[2] for s in ins]
    if fusion_width_as_channels:
      fw = 0
      for s in ins:  # the original's loop, with shape[3] = width
        if s[2] > fw:
          fw = s[1]
    else:
      fw = max(chans)
    widths.append(fw)
    if len(ins) > 1 and not edge_weights_given:
      params += len(ins)
    if attention_mode == 'peer':
      below = [shapes[k] for k in structures.nodes_below(structure, level)]
      lg = max(s[2] for s in below)
      for s in below:
        dense(s[2], lg, t)
      for c in chans:
        params += len(below)
        dense(lg, c, t)
    elif attention_mode == 'self':
      for c in chans:
        dense(c, c, t)
    for c in sorted(set(chans)):
      if c != fw:
        conv(1, c, fw, h, w)
    cin = fw
    for b in range(blocks_per_level[level]):
      s = stride if b == 0 else 1
      ho, wo = math.ceil(h / s), math.ceil(w / s)
      if b == 0:
        conv(1, cin, fo, ho, wo)
        bn(fo)
      conv(1, cin, fa, h, w)
      bn(fa)
      if s > 1:
        conv(9, fa, fb, ho, wo)
        bn(fb)
        conv(3, fb, fb, ho, wo)
        bn(fb)
      else:
        conv(27, fa, fb, ho, wo)
        bn(fb)
      conv(1, fb, fo, ho, wo)
      bn(fo)
      cin, h, w = fo, ho, wo
    shapes.append((h, w, fo))
  top = next(i for i, n in enumerate(structure) if n[0] == 3)
  h, w, c = shapes[top]
  conv(1, c, head_filters[0], h, w)
  bn(head_filters[0])
  conv(1, head_filters[0], head_filters[1], h, w)
  bn(head_filters[1])
  dense(head_filters[1], num_classes, t if max_pool_predictions else 1)
  return Complexity(params=params, flops=2 * macs, node_shapes=shapes,
                    fusion_widths=widths)
