"""FLOPs by hand from the layer shapes: the oracle `benchmarks/graph_flops.py`
(the counter every benchmark uses) is checked against. Multiply-add = 2 FLOPs;
only the contractions (matmuls, convolutions) are counted, as the counter."""
import math
from typing import Dict, Optional, Sequence

from official_ext.assemblenet import structures
from tests.assemblenet import complexity


def dbof_train_flops_per_example(size) -> int:
  """DBoF + MoE training step (`benchmarks/yt8m.Size`), per example.

  Forward and weight gradients of the three matmul groups (cluster [F, K]
  per frame, hidden [K, H], MoE gate + expert [H, C(2M+1)]) plus the input
  gradients the backward pass needs (into the hidden and MoE layers); no
  gradient with respect to the frame features (nothing trains them).
  """
  t, f, k, h = size.frames, size.features, size.cluster, size.hidden
  moe = h * size.classes * (2 * size.mixtures + 1)
  cluster = 2 * t * f * k
  return 2 * cluster + 3 * 2 * k * h + 3 * 2 * moe


def nextvlad_train_flops_per_example(size) -> int:
  """NeXtVLAD training step (`benchmarks/yt8m.NextVladSize`), per example.

  Per stream of N features (wide = expansion x N, G groups, K clusters, T
  frames): the expansion [N, wide] per frame, forward and weight gradient
  (no gradient w.r.t. the frames); forward, weight and input gradients (x3)
  of the group attention [wide, G], the assignment [wide, G K] per frame and
  the aggregation (T G x K by T G x wide / G). Then x3 for the hidden layer,
  the SE gate's two layers and the classifier.
  """
  t = size.frames
  flops = 0
  vlad_width = 0
  for n, k, g in zip(size.feature_sizes, size.cluster_sizes, size.groups):
    wide = size.expansion * n
    flops += 2 * (2 * t * n * wide)
    flops += 3 * (2 * t * wide * g + 2 * t * wide * g * k)
    flops += 3 * (2 * t * g * k * (wide // g))
    vlad_width += wide // g * k
  h = size.hidden
  flops += 3 * 2 * (vlad_width * h + 2 * h * (h // size.gating_reduction) +
                    h * size.classes)
  return flops


def assemblenet_flops(structure=None,
                      blocks_per_level: Sequence[int] = (
                          structures.ASSEMBLENET_PLUS_LITE_BLOCKS_PER_LEVEL),
                      attention_mode: Optional[str] = 'peer',
                      fusion_width_as_channels: bool = False,
                      num_frames: int = 32, height: int = 224,
                      width: int = 224, num_classes: int = 157,
                      stem_filters: int = 24,
                      head_filters: Sequence[int] = (432, 2048),
                      flow_iterations: int = 20,
                      head: bool = True) -> Dict[str, int]:
  """AssembleNet++lite on one clip, by the op type the counter sees.

  'Conv3D': every 3-D convolution; 'MatMul': the attention's and the head's
  dense layers; 'Conv2D': the representation flow's difference kernels (one
  channel, full resolution, T - 1 frame pairs: the image gradient's two
  3-tap kernels, then per iteration eight 2-tap kernels, of which the last
  iteration's four flow gradients feed nothing). 'train': the training
  step: every convolution and dense layer x3 (forward, weight and input
  gradients) but for the stems' first convolutions, whose input (the clip,
  the flow) takes no gradient; the flow has no gradient either. Node shapes
  and fusion widths come from `tests/assemblenet/complexity.py`.
  """
  structure = structures.validate_structure(
      structure if structure is not None else
      structures.ASSEMBLENET_PLUS_LITE_STRUCTURE)
  shapes = complexity.analyze(
      structure, blocks_per_level, attention_mode=attention_mode,
      fusion_width_as_channels=fusion_width_as_channels,
      height=height, width=width,
      num_classes=num_classes, stem_filters=stem_filters,
      head_filters=head_filters)
  t = num_frames
  macs = {'Conv3D': 0, 'MatMul': 0}
  no_input_gradient = 0

  def conv(k, cin, cout, h, w):
    macs['Conv3D'] += k * cin * cout * t * h * w
    return k * cin * cout * t * h * w

  def dense(cin, cout, positions):
    macs['MatMul'] += cin * cout * positions

  for i, node in enumerate(structure):
    if node[0] < 0:
      cin = 3 if node[0] == structures.STEM_RGB else 2
      h, w = math.ceil(height / 2), math.ceil(width / 2)
      no_input_gradient += conv(9, cin, stem_filters, h, w)
      conv(3, stem_filters, stem_filters, h, w)
      continue
    level, inputs, (fa, fb, fo), _, stride = node
    ins = [shapes.node_shapes[j] for j in inputs]
    h, w = min(s[0] for s in ins), min(s[1] for s in ins)
    chans = [s[2] for s in ins]
    fw = shapes.fusion_widths[i]
    if attention_mode == 'peer':
      below = [shapes.node_shapes[k]
               for k in structures.nodes_below(structure, level)]
      lg = max(s[2] for s in below)
      for s in below:
        dense(s[2], lg, t)
      for c in chans:
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
      conv(1, cin, fa, h, w)
      if s > 1:
        conv(9, fa, fb, ho, wo)
        conv(3, fb, fb, ho, wo)
      else:
        conv(27, fa, fb, ho, wo)
      conv(1, fb, fo, ho, wo)
      cin, h, w = fo, ho, wo
  if head:
    top = next(i for i, n in enumerate(structure) if n[0] == 3)
    h, w, c = shapes.node_shapes[top]
    conv(1, c, head_filters[0], h, w)
    conv(1, head_filters[0], head_filters[1], h, w)
    dense(head_filters[1], num_classes, 1)
  flow = 0
  if any(n[0] == structures.STEM_FLOW for n in structure):
    flow = (t - 1) * height * width * (2 * 3 + 8 * 2 * flow_iterations - 4 * 2)
  flops = {k: 2 * v for k, v in macs.items()}
  flops['Conv2D'] = 2 * flow
  flops['train'] = 3 * (flops['Conv3D'] + flops['MatMul']) - (
      2 * no_input_gradient) + flops['Conv2D']
  return flops


def assemblenet_forward_flops(**kwargs) -> int:
  """`assemblenet_flops`' forward pass, all op types."""
  f = assemblenet_flops(**kwargs)
  return f['Conv3D'] + f['MatMul'] + f['Conv2D']
