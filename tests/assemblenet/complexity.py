"""Trainable parameters, node shapes and fusion widths of AssembleNet++lite
(`analyze`) and AssembleNet / AssembleNet++ (`analyze_assemblenet`), from a
structure, written from the architecture's description (not from the
layers) for tests to check the built model against."""
import dataclasses
import math
from typing import Any, List, Optional, Sequence

from official_ext.assemblenet import structures


@dataclasses.dataclass
class Complexity:
  params: int
  node_shapes: List[tuple]  # (H, W, C) of every node
  fusion_widths: List[Optional[int]]  # None for a stem


def analyze(structure: Any = None,
            blocks_per_level: Sequence[int] = (
                structures.ASSEMBLENET_PLUS_LITE_BLOCKS_PER_LEVEL),
            edge_weights_given: bool = True,
            attention_mode: Optional[str] = 'peer',
            fusion_width_as_channels: bool = False,
            height: int = 224, width: int = 224,
            num_classes: int = 157, stem_filters: int = 24,
            head_filters: Sequence[int] = (432, 2048)) -> Complexity:
  """Trainable parameters (conv kernels, batch-norm gamma and beta, dense
  kernels and biases, learned edge weights, peer-attention weights) and the
  shapes of one clip's nodes."""
  structure = structures.validate_structure(
      structure if structure is not None else
      structures.ASSEMBLENET_PLUS_LITE_STRUCTURE)
  params = 0

  def conv(k, cin, cout):
    nonlocal params
    params += k * cin * cout

  def bn(c):
    nonlocal params
    params += 2 * c

  def dense(cin, cout):
    nonlocal params
    params += cin * cout + cout

  shapes = []
  widths = []
  for node in structure:
    if node[0] < 0:
      cin = 3 if node[0] == structures.STEM_RGB else 2
      h, w = math.ceil(height / 2), math.ceil(width / 2)
      conv(9, cin, stem_filters)
      bn(stem_filters)
      conv(3, stem_filters, stem_filters)
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
        dense(s[2], lg)
      for c in chans:
        params += len(below)
        dense(lg, c)
    elif attention_mode == 'self':
      for c in chans:
        dense(c, c)
    for c in sorted(set(chans)):
      if c != fw:
        conv(1, c, fw)
    cin = fw
    for b in range(blocks_per_level[level]):
      s = stride if b == 0 else 1
      ho, wo = math.ceil(h / s), math.ceil(w / s)
      if b == 0:
        conv(1, cin, fo)
        bn(fo)
      conv(1, cin, fa)
      bn(fa)
      if s > 1:
        conv(9, fa, fb)
        bn(fb)
        conv(3, fb, fb)
        bn(fb)
      else:
        conv(27, fa, fb)
        bn(fb)
      conv(1, fb, fo)
      bn(fo)
      cin, h, w = fo, ho, wo
    shapes.append((h, w, fo))
  top = next(i for i, n in enumerate(structure) if n[0] == 3)
  h, w, c = shapes[top]
  conv(1, c, head_filters[0])
  bn(head_filters[0])
  conv(1, head_filters[0], head_filters[1])
  bn(head_filters[1])
  dense(head_filters[1], num_classes)
  return Complexity(params=params, node_shapes=shapes, fusion_widths=widths)


def analyze_assemblenet(structure: Any = None,
                        blocks_per_level: Sequence[int] = (
                            structures.ASSEMBLENET_BLOCKS_PER_DEPTH[50]),
                        plus: bool = False,
                        attention_mode: Optional[str] = None,
                        edge_weights_given: bool = True,
                        num_object_classes: int = 151,
                        height: int = 224, width: int = 224,
                        num_classes: int = 157) -> Complexity:
  """AssembleNet's (`plus`: AssembleNet++'s) trainable parameters and one
  clip's node shapes, as `analyze`; node filters are one int f (blocks end
  with 4 f channels), stems have 128 // (number of stems) filters and an
  object stem num_object_classes channels."""
  structure = structures.validate_structure(
      structure if structure is not None else structures.ASN50_STRUCTURE,
      int_filters=True)
  stem_filters = 128 // sum(1 for n in structure if n[0] < 0)
  params = 0

  def add(n):
    nonlocal params
    params += n

  shapes, widths = [], []
  for node in structure:
    if node[0] == structures.STEM_OBJECT:
      shapes.append((math.ceil(height / 4), math.ceil(width / 4),
                     num_object_classes))
      widths.append(None)
      continue
    if node[0] < 0:
      cin = 3 if node[0] == structures.STEM_RGB else 2
      add(49 * cin * stem_filters + 2 * stem_filters)
      if node[0] == structures.STEM_RGB:
        add(5 * stem_filters * stem_filters + 2 * stem_filters)
      shapes.append((math.ceil(math.ceil(height / 2) / 2),
                     math.ceil(math.ceil(width / 2) / 2), stem_filters))
      widths.append(None)
      continue
    level, inputs, f, _, stride = node
    ins = [shapes[j] for j in inputs]
    h, w = min(s[0] for s in ins), min(s[1] for s in ins)
    chans = [s[2] for s in ins]
    if len(ins) == 1:
      fw = chans[0]
    else:
      fw = max(c for j, c in zip(inputs, chans)
               if structure[j][0] != structures.STEM_OBJECT)
      if not edge_weights_given:
        add(len(ins))
    widths.append(fw)
    if attention_mode == 'peer':
      below = [shapes[k][2] for k in structures.nodes_below(structure, level)]
      lg = max(below)
      add(sum(c * lg + lg for c in below))
      add(sum(len(below) + lg * c + c for c in chans))
    elif attention_mode == 'self':
      add(sum(c * c + c for c in chans))
    add(sum(c * fw for c in set(chans) if c != fw))
    inter = structures.ASSEMBLENET_INTERMEDIATE_CHANNELS[level]
    cin = fw
    for b in range(blocks_per_level[level]):
      s = stride if b == 0 else 1
      if b == 0:
        add(cin * 4 * f + 8 * f)  # projection shortcut and its BN
      add((3 if b % 2 else 1) * cin * f + 2 * f)
      add(9 * f * inter + 2 * inter)
      add(inter * 4 * f + 8 * f)
      cin, h, w = 4 * f, math.ceil(h / s), math.ceil(w / s)
    shapes.append((h, w, 4 * f))
  finals = [shapes[i][2] for i, n in enumerate(structure) if n[0] == 3]
  add(finals[0] * num_classes + num_classes)
  return Complexity(params=params, node_shapes=shapes, fusion_widths=widths)
