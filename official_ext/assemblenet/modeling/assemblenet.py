"""AssembleNet (Ryoo et al., ICLR 2020) and AssembleNet++ (ECCV 2020) in
tf_keras, registered with Model Garden's factories: backbone builders
'assemblenet' and 'assemblenet_plus' (clips [B, T, H, W, 3], and object maps
for a structure with an object stem -> endpoints {'node_<i>', 'output'}) and
3-D model builders of the same names ({'image': clips[, 'objects': class
ids]} -> logits [B, num_classes]); the networks and their equality with the
TF1 code: docs/assemblenet.md#assemblenet-and-assemblenet."""
import json
from typing import Any, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras

from official.vision.modeling import factory_3d
from official.vision.modeling.backbones import factory as backbone_factory
from official_ext.assemblenet import structures
from official_ext.assemblenet.modeling import assemblenet_plus_lite as lite
from official_ext.assemblenet.modeling import blocks
from official_ext.assemblenet.modeling import convolutions
from official_ext.assemblenet.modeling import fusion
from official_ext.assemblenet.modeling import recompute

layers = tf_keras.layers

COMBINE_METHODS = ('sigmoid',)


def frame_max_pool(x: tf.Tensor, window: int, stride: int) -> tf.Tensor:
  """A 'same'-padded 2-D max pool of every frame: [B, T, H, W, C] -> [B, T,
  ceil(H / stride), ceil(W / stride), C]."""
  b, t, h, w, c = convolutions.dims(x)
  pooled = tf.nn.max_pool2d(tf.reshape(x, [-1, h, w, c]), window, stride,
                            'SAME')
  out = tf.reshape(pooled, [b, t, *convolutions.dims(pooled)[1:]])
  out.set_shape([x.shape[0], x.shape[1], *pooled.shape[1:]])
  return out


def pooled_one_hot(ids: tf.Tensor, depth: int, size: int) -> tf.Tensor:
  """`frame_max_pool(tf.one_hot(ids, depth), size, size)` of int ids
  [B, T, H, W] in [0, depth), without the full-resolution one-hot: float32
  [B, T, ceil(H / size), ceil(W / size), depth], 1 where a window holds the
  id."""
  b, t, h, w = convolutions.dims(ids)
  ho, wo = -(-h // size), -(-w // size)
  pad_h, pad_w = ho * size - h, wo * size - w
  # 'SAME' pads the end with the odd pixel; padding pixels take id `depth`,
  # a column dropped at the end.
  ids = tf.pad(ids, [[0, 0], [0, 0], [pad_h // 2, pad_h - pad_h // 2],
                     [pad_w // 2, pad_w - pad_w // 2]], constant_values=depth)
  windows = tf.reshape(tf.transpose(
      tf.reshape(ids, [-1, ho, size, wo, size]), [0, 1, 3, 2, 4]),
                       [-1, size * size])
  n = tf.shape(windows)[0]
  rows = tf.repeat(tf.range(n), size * size)
  indices = tf.stack([rows, tf.reshape(windows, [-1])], axis=1)
  present = tf.tensor_scatter_nd_max(
      tf.zeros([n, depth + 1]), indices, tf.ones([n * size * size]))
  out = tf.reshape(present[:, :depth], [b, t, ho, wo, depth])
  out.set_shape([ids.shape[0], ids.shape[1],
                 *[d if isinstance(d, int) else None for d in (ho, wo)],
                 depth])
  return out


class _Stem(layers.Layer):
  """A stem's common part: runs `_forward`, through `recompute.recompute_grad`
  in training calls when `recompute_grad`."""

  def __init__(self, recompute_grad: bool = False, **kwargs):
    super().__init__(**kwargs)
    self._recompute_grad = recompute_grad

  def call(self, inputs, training=None):
    if self._recompute_grad and training is True:
      return recompute.recompute_grad(
          lambda x: self._forward(x, True))(inputs)
    return self._forward(inputs, training)

  def _forward(self, inputs, training):
    raise NotImplementedError

  def get_config(self):
    config = super().get_config()
    config.update(recompute_grad=self._recompute_grad)
    return config


class RgbStem(_Stem):
  """AssembleNet's RGB stem: per-frame 7x7 conv stride 2 (fixed padding),
  BN-ReLU, a [5, 1, 1] temporal conv dilated by `temporal_dilation` (truncated
  normal sqrt(2 / (5 filters)) when dilated, as the original), BN-ReLU, a
  3x3 max pool stride 2 ('same'): [B, T, H, W, 3] -> [B, T, ceil(ceil(H / 2)
  / 2), ..., filters]."""

  def __init__(self, filters: int, temporal_dilation: int = 1,
               bn_decay: float = blocks.BATCH_NORM_DECAY,
               bn_epsilon: float = blocks.BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    temporal_dilation = max(int(temporal_dilation), 1)
    self._args = dict(filters=filters, temporal_dilation=temporal_dilation,
                      bn_decay=bn_decay, bn_epsilon=bn_epsilon,
                      use_sync_bn=use_sync_bn)
    bn = dict(bn_decay=bn_decay, bn_epsilon=bn_epsilon,
              use_sync_bn=use_sync_bn)
    init = None
    if temporal_dilation > 1:
      init = tf_keras.initializers.TruncatedNormal(
          stddev=float(np.sqrt(2.0 / (5 * filters))))
    self._conv = convolutions.conv2d_fixed_padding(
        filters, 7, 2, kernel_regularizer=kernel_regularizer, name='conv')
    self._bn = blocks.BatchNormRelu(name='bn', **bn)
    self._temporal = convolutions.conv3d_same_padding(
        filters, [5, 1, 1], 1, temporal_dilation, kernel_initializer=init,
        kernel_regularizer=kernel_regularizer, name='conv_temporal')
    self._temporal_bn = blocks.BatchNormRelu(name='bn_temporal', **bn)

  def _forward(self, inputs, training):
    x = self._bn(self._conv(inputs), training=training)
    x = self._temporal_bn(self._temporal(x), training=training)
    return frame_max_pool(x, 3, 2)

  def get_config(self):
    config = super().get_config()
    config.update(self._args)
    return config


class FlowStem(_Stem):
  """AssembleNet's optical-flow stem on the representation flow: per-frame
  7x7 conv stride 2 (fixed padding), BN-ReLU, a 2x2 max pool stride 2
  ('same'); the node's temporal dilation is not used (as in the original)."""

  def __init__(self, filters: int, bn_decay: float = blocks.BATCH_NORM_DECAY,
               bn_epsilon: float = blocks.BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    self._args = dict(filters=filters, bn_decay=bn_decay,
                      bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn)
    self._conv = convolutions.conv2d_fixed_padding(
        filters, 7, 2, kernel_regularizer=kernel_regularizer, name='conv')
    self._bn = blocks.BatchNormRelu(name='bn', bn_decay=bn_decay,
                                    bn_epsilon=bn_epsilon,
                                    use_sync_bn=use_sync_bn)

  def _forward(self, inputs, training):
    x = self._bn(self._conv(inputs), training=training)
    return frame_max_pool(x, 2, 2)

  def get_config(self):
    config = super().get_config()
    config.update(self._args)
    return config


class ObjectStem(layers.Layer):
  """AssembleNet++'s object stem: per-pixel object class ids int [B, T, H, W]
  in [0, num_object_classes) one-hot encoded (one channel per class, float)
  and max-pooled 4x4 stride 4 ('same'): -> [B, T, ceil(H / 4), ceil(W / 4),
  num_object_classes]. An id outside the range is an error naming the model
  input 'objects'."""

  def __init__(self, num_object_classes: int, **kwargs):
    super().__init__(**kwargs)
    if num_object_classes < 1:
      raise ValueError(f'num_object_classes must be >= 1; got '
                       f'{num_object_classes}.')
    self._num_object_classes = num_object_classes

  def call(self, inputs):
    ids = tf.cast(inputs, tf.int32)
    k = self._num_object_classes
    checks = [
        tf.debugging.assert_non_negative(
            ids, message="model input 'objects': negative object class id"),
        tf.debugging.assert_less(
            ids, k, message=(f"model input 'objects': an object class id >= "
                             f'num_object_classes ({k})'))]
    with tf.control_dependencies(checks):
      ids = tf.identity(ids)
    return tf.cast(pooled_one_hot(ids, k, 4), self.compute_dtype)

  def get_config(self):
    config = super().get_config()
    config.update(num_object_classes=self._num_object_classes)
    return config


def _checked(model_structure, model_edge_weights, blocks_per_level,
             attention_mode, combine_method, plus, input_specs):
  """(structure, edge weights, input shape) of the backbone's arguments,
  checked."""
  name = 'AssembleNet++' if plus else 'AssembleNet'
  structure = structures.validate_structure(
      model_structure, model_edge_weights, blocks_per_level, int_filters=True)
  edge_weights = structures.normalize_edge_weights(model_edge_weights)
  if combine_method not in COMBINE_METHODS:
    raise ValueError(f'combine_method must be one of {COMBINE_METHODS} (the '
                     "original's 'concat' is not implemented); got "
                     f'{combine_method!r}.')
  if attention_mode not in fusion.ATTENTION_MODES:
    raise ValueError(f'attention_mode must be None, "self" or "peer"; got '
                     f'{attention_mode!r}.')
  if not plus:
    if attention_mode:
      raise ValueError('AssembleNet has no attention (attention_mode '
                       f'{attention_mode!r}); use assemblenet_plus.')
    for i, node in enumerate(structure):
      if node[0] == structures.STEM_OBJECT:
        raise ValueError(
            f'model structure node {i} ({node!r}) is an object-input stem '
            '(-3): AssembleNet takes RGB clips only; object inputs are '
            "AssembleNet++'s (backbone type 'assemblenet_plus').")
  if input_specs is None:
    input_specs = layers.InputSpec(shape=[None, 32, 224, 224, 3])
  shape = list(input_specs.shape)
  if len(shape) != 5 or None in shape[2:]:
    raise ValueError(f'{name} needs input shape [batch, T, H, W, C] with '
                     f'static H, W and C (T may be None); got {shape}.')
  if shape[1] is not None:
    structures.check_num_frames(structure, shape[1], f'input_specs {shape}')
  return structure, edge_weights, shape


class _Nodes(lite._Nodes):  # pylint: disable=protected-access
  """Builds AssembleNet(++)'s nodes in order: stems (RGB, flow, object),
  then each block node's fusion and block group; the lite's sharing of
  pooled inputs and peer means."""

  def __init__(self, *args, num_object_classes: int, **kwargs):
    super().__init__(*args, **kwargs)
    self.num_object_classes = num_object_classes

  def build_all(self, inputs, flow, objects) -> Dict[str, Any]:
    """{'node_<i>': every node's output, 'output': the first level-3
    node's}."""
    endpoints = {}
    for i, node in enumerate(self.structure):
      if node[0] == structures.STEM_RGB:
        out = RgbStem(self.stem_filters, node[1],
                      kernel_regularizer=self.kernel_regularizer,
                      recompute_grad=self.recompute_grad, name=f'node_{i}',
                      **self.bn)(inputs)
      elif node[0] == structures.STEM_FLOW:
        out = FlowStem(self.stem_filters,
                       kernel_regularizer=self.kernel_regularizer,
                       recompute_grad=self.recompute_grad, name=f'node_{i}',
                       **self.bn)(flow)
      elif node[0] == structures.STEM_OBJECT:
        out = ObjectStem(self.num_object_classes, name=f'node_{i}')(objects)
      else:
        out = self.block_node(i, node)
      self.streams.append(out)
      endpoints[f'node_{i}'] = out
    first_top = next(i for i, n in enumerate(self.structure) if n[0] == 3)
    endpoints['output'] = self.streams[first_top]
    return endpoints

  def block_node(self, i, node):
    level, input_ids, filters, dilation, stride = node
    node_inputs = self.pooled(input_ids)
    peers = []
    if self.attention_mode == 'peer':
      peers = [self.peer(k)
               for k in structures.nodes_below(self.structure, level)]
    weights = None
    if self.edge_weights is not None and len(input_ids) > 1:
      weights = self.edge_weights[i][0]
    excluded = [p for p, j in enumerate(input_ids)
                if self.structure[j][0] == structures.STEM_OBJECT]
    fused = fusion.PeerAttentionFusion(
        num_inputs=len(node_inputs), attention_mode=self.attention_mode,
        edge_weights=weights, kernel_regularizer=self.kernel_regularizer,
        recompute_grad=self.recompute_grad, width_excluded=excluded,
        name=f'node_{i}_fusion')(node_inputs + peers)
    return blocks.InterleavedBlockGroup(
        filters, structures.ASSEMBLENET_INTERMEDIATE_CHANNELS[level],
        self.blocks_per_level[level], stride, dilation,
        recompute_grad=self.recompute_grad,
        kernel_regularizer=self.kernel_regularizer, name=f'node_{i}',
        **self.bn)(fused)


class AssembleNet(tf_keras.Model):
  """The AssembleNet / AssembleNet++ backbone (functional tf_keras.Model):
  [B, T, H, W, 3] float clips, or for a structure with an object stem (-3)
  {'image': clips, 'objects': int class ids [B, T, H, W]} -> {'node_<i>':
  [B, T, H_i, W_i, C_i] of every node, 'output': the first level-3 node's}.

  Args:
    model_structure: node list or its JSON (`structures`, one int of filters
      per block node); default `structures.ASN50_STRUCTURE`.
    model_edge_weights: per-node edge weights (or JSON); None / '' / '[]'
      make every fusion's edge weights trainable.
    blocks_per_level: blocks per block group for levels 0..3
      (`structures.assemblenet_blocks_per_level(depth)`).
    input_specs: InputSpec of the clips [B, T, H, W, 3], H and W static; T
      None takes any frame count the structure allows.
    plus: AssembleNet++ (attention, object stems) rather than AssembleNet.
    attention_mode: None, 'self' or 'peer' (AssembleNet++ only).
    combine_method: 'sigmoid' (edge-weighted sum).
    num_object_classes: the object maps' class count (AssembleNet++).
    stem_filters: filters of every stem; None: 128 // the number of stems,
      as the original.
    bn_decay, bn_epsilon, use_sync_bn: batch norm settings.
    recompute_grad: gradient checkpointing of every stem, fusion and block
      group (`recompute.recompute_grad`).
    rep_flow_options: kwargs of `representation_flow.RepresentationFlow`
      (the original: 40 iterations).
    kernel_regularizer: regularizer of every conv / dense kernel."""

  def __init__(self,
               model_structure: Any = None,
               model_edge_weights: Any = None,
               blocks_per_level: Sequence[int] = (
                   structures.ASSEMBLENET_BLOCKS_PER_DEPTH[50]),
               input_specs: Optional[layers.InputSpec] = None,
               plus: bool = False,
               attention_mode: Optional[str] = None,
               combine_method: str = 'sigmoid',
               num_object_classes: int = 151,
               stem_filters: Optional[int] = None,
               bn_decay: float = blocks.BATCH_NORM_DECAY,
               bn_epsilon: float = blocks.BATCH_NORM_EPSILON,
               use_sync_bn: bool = False,
               recompute_grad: bool = False,
               rep_flow_options: Optional[Dict[str, Any]] = None,
               kernel_regularizer=None,
               **kwargs):
    if model_structure is None:
      model_structure = structures.ASN50_STRUCTURE
    structure, edge_weights, shape = _checked(
        model_structure, model_edge_weights, blocks_per_level,
        attention_mode, combine_method, plus, input_specs)
    num_stems = sum(1 for n in structure if n[0] < 0)
    if stem_filters is None:
      stem_filters = 128 // num_stems
    rep_flow_options = dict(rep_flow_options or {'num_iter': 40})
    image = tf_keras.Input(shape=shape[1:], batch_size=shape[0], name='image')
    has_objects = any(n[0] == structures.STEM_OBJECT for n in structure)
    objects = None
    inputs = image
    if has_objects:
      objects = tf_keras.Input(shape=shape[1:4], batch_size=shape[0],
                               dtype=tf.int32, name='objects')
      inputs = {'image': image, 'objects': objects}
    nodes = _Nodes(
        structure, edge_weights, blocks_per_level, stem_filters,
        attention_mode, False, recompute_grad, kernel_regularizer, True,
        dict(bn_decay=bn_decay, bn_epsilon=bn_epsilon,
             use_sync_bn=use_sync_bn),
        num_object_classes=num_object_classes)
    endpoints = nodes.build_all(
        image, lite._flow(structure, image, rep_flow_options), objects)  # pylint: disable=protected-access
    super().__init__(inputs=inputs, outputs=endpoints, **kwargs)
    self._config_dict = dict(
        model_structure=json.dumps(structure),
        model_edge_weights=(json.dumps(edge_weights) if edge_weights else ''),
        blocks_per_level=list(blocks_per_level), input_specs=shape,
        plus=plus, attention_mode=attention_mode,
        combine_method=combine_method,
        num_object_classes=num_object_classes, stem_filters=stem_filters,
        bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn,
        recompute_grad=recompute_grad, rep_flow_options=rep_flow_options,
        kernel_regularizer=(tf_keras.regularizers.serialize(
            tf_keras.regularizers.get(kernel_regularizer))
                            if kernel_regularizer else None))
    self._structure = structure
    self._takes_objects = has_objects
    self._output_specs = {k: v.shape for k, v in endpoints.items()}

  @property
  def structure(self):
    return self._structure

  @property
  def takes_objects(self) -> bool:
    """Whether the backbone takes {'image', 'objects'} (an object stem)."""
    return self._takes_objects

  @property
  def output_specs(self):
    return self._output_specs

  def get_config(self):
    return dict(self._config_dict)

  @classmethod
  def from_config(cls, config, custom_objects=None):
    config = dict(config)
    config['input_specs'] = layers.InputSpec(shape=config['input_specs'])
    return cls(**config)


class MultiStreamHead(layers.Layer):
  """AssembleNet's head (the original's `multi_stream_heads`): each final
  node's output [B, T, H, W, C] averaged over space, over time, and over the
  final nodes, dropout, then a dense layer to num_classes (normal(0.01)
  init, float32 logits [B, num_classes]). With `max_pool_predictions` the
  per-frame logits are summed with softmax_t(logits_t / sqrt(T)) weights
  instead of averaging over time."""

  def __init__(self, num_classes: int, max_pool_predictions: bool = False,
               dropout_rate: float = 0.0, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f'dropout_rate is a drop rate in [0, 1); got '
                       f'{dropout_rate}.')
    self._args = dict(num_classes=num_classes,
                      max_pool_predictions=max_pool_predictions,
                      dropout_rate=dropout_rate)
    self._dropout = layers.Dropout(dropout_rate)
    self._dense = layers.Dense(
        num_classes, kernel_initializer=tf_keras.initializers.RandomNormal(
            stddev=0.01), kernel_regularizer=kernel_regularizer,
        dtype='float32', name='final_dense')

  def call(self, inputs, training=None):
    inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    per_frame = [tf.reduce_mean(x, axis=[2, 3]) for x in inputs]  # [B, T, C]
    if not self._args['max_pool_predictions']:
      per_frame = [tf.reduce_mean(x, axis=1) for x in per_frame]  # [B, C]
    x = per_frame[0] if len(per_frame) == 1 else (
        tf.add_n(per_frame) / len(per_frame))
    x = self._dropout(x, training=training)
    logits = self._dense(tf.cast(x, tf.float32))
    if self._args['max_pool_predictions']:
      num_frames = tf.cast(tf.shape(logits)[1], tf.float32)
      acts = tf.nn.softmax(logits / tf.sqrt(num_frames), axis=1)
      logits = tf.reduce_sum(logits * acts, axis=1)
    return logits

  def get_config(self):
    config = super().get_config()
    config.update(self._args)
    return config


class AssembleNetModel(tf_keras.Model):
  """Backbone + `MultiStreamHead` on every level-3 node: {'image': [B, T, H,
  W, 3]} (and 'objects': int32 [B, T, H, W] for a backbone with an object
  stem) -> logits [B, K]. A missing or unexpected 'objects' input is an
  error naming `use_object_input`."""

  def __init__(self, backbone: AssembleNet, num_classes: int,
               input_specs: Optional[Dict[str, layers.InputSpec]] = None,
               max_pool_predictions: bool = False, dropout_rate: float = 0.0,
               kernel_regularizer=None, **kwargs):
    if input_specs is None:
      input_specs = {'image': layers.InputSpec(
          shape=[None] + list(backbone.get_config()['input_specs'][1:]))}
    shape = list(input_specs['image'].shape)
    inputs = {'image': tf_keras.Input(shape=shape[1:], batch_size=shape[0],
                                      name='image')}
    if backbone.takes_objects:
      inputs['objects'] = tf_keras.Input(
          shape=shape[1:4], batch_size=shape[0], dtype=tf.int32,
          name='objects')
      endpoints = backbone(dict(inputs))
    else:
      endpoints = backbone(inputs['image'])
    finals = [endpoints[f'node_{i}']
              for i, n in enumerate(backbone.structure) if n[0] == 3]
    head = MultiStreamHead(num_classes, max_pool_predictions, dropout_rate,
                           kernel_regularizer=kernel_regularizer, name='head')
    logits = head(finals)
    super().__init__(inputs=inputs, outputs=logits, **kwargs)
    self._backbone = backbone
    self._head = head
    self._config_dict = dict(num_classes=num_classes,
                             max_pool_predictions=max_pool_predictions,
                             dropout_rate=dropout_rate)

  def __call__(self, inputs, *args, **kwargs):
    _check_object_input(inputs, self._backbone.takes_objects)
    return super().__call__(inputs, *args, **kwargs)

  @property
  def backbone(self):
    return self._backbone

  @property
  def head(self) -> MultiStreamHead:
    return self._head

  @property
  def checkpoint_items(self):
    return dict(backbone=self._backbone, head=self._head)

  def get_config(self):
    return dict(self._config_dict)


def _check_object_input(inputs, takes_objects: bool) -> None:
  if not isinstance(inputs, dict):
    return
  if takes_objects and 'objects' not in inputs:
    raise ValueError(
        "The model's structure has an object stem (-3) and needs the input "
        "'objects' (int32 class ids [B, T, H, W]); the features have "
        f'{sorted(inputs)}. Feed the object maps (use_object_input: true) or '
        'use a structure without an object stem.')
  if not takes_objects and 'objects' in inputs:
    raise ValueError(
        "The input 'objects' was given, but the model's structure has no "
        'object stem (-3) (use_object_input: false): set '
        'use_object_input: true with a structure that has one, or drop the '
        'object maps from the features.')


def build_backbone_from_config(input_specs, backbone_type: str,
                               backbone_config,
                               kernel_regularizer=None) -> AssembleNet:
  """The backbone of an `AssembleNet` / `AssembleNetPlus` config (structure
  and edge weights inline or from their `*_path` files)."""
  c = backbone_config
  plus = backbone_type == 'assemblenet_plus'
  prefix = structures.backbone_key(backbone_type)
  structure, edge_weights = structures.from_backbone_config(c, prefix=prefix)
  blocks_per_level = (tuple(c.blocks_per_level) if c.blocks_per_level else
                      structures.assemblenet_blocks_per_level(c.model_id))
  attention_mode = None
  num_object_classes = 151
  if plus:
    attention_mode = c.attention_mode or None
    num_object_classes = c.num_object_classes
    has_objects = any(n[0] == structures.STEM_OBJECT for n in structure)
    if bool(c.use_object_input) != has_objects:
      raise ValueError(
          f'{prefix}use_object_input is {c.use_object_input}, but the model '
          f"structure {'has' if has_objects else 'has no'} object stem (-3): "
          'they must agree (the model takes the input \'objects\' exactly '
          'when its structure has an object stem).')
  with lite._policy(c.precision):  # pylint: disable=protected-access
    return AssembleNet(
        model_structure=structure,
        model_edge_weights=edge_weights,
        blocks_per_level=blocks_per_level,
        input_specs=input_specs,
        plus=plus,
        attention_mode=attention_mode,
        combine_method=c.combine_method,
        num_object_classes=num_object_classes,
        stem_filters=c.stem_filters,
        bn_decay=c.bn_decay, bn_epsilon=c.bn_epsilon,
        use_sync_bn=c.use_sync_bn, recompute_grad=c.recompute_grad,
        rep_flow_options=c.rep_flow.as_dict(),
        kernel_regularizer=kernel_regularizer)


def _backbone_builder(backbone_type: str):

  def build(input_specs: layers.InputSpec, backbone_config,
            norm_activation_config, l2_regularizer=None) -> AssembleNet:
    del norm_activation_config
    if backbone_config.type != backbone_type:
      raise ValueError(f'backbone type {backbone_config.type!r} is not '
                       f'{backbone_type!r}.')
    return build_backbone_from_config(input_specs, backbone_type,
                                      backbone_config.get(), l2_regularizer)

  build.__doc__ = (f"Model Garden backbone builder '{backbone_type}'; the "
                   'batch-norm settings come from the backbone config, not '
                   '`norm_activation_config`.')
  return build


def _model_builder(backbone_type: str):

  def build(input_specs: layers.InputSpec, model_config, num_classes: int,
            l2_regularizer=None) -> AssembleNetModel:
    backbone = backbone_factory.build_backbone(
        input_specs=input_specs, backbone_config=model_config.backbone,
        norm_activation_config=None, l2_regularizer=l2_regularizer)
    with lite._policy(model_config.backbone.get().precision):  # pylint: disable=protected-access
      return AssembleNetModel(
          backbone, num_classes, input_specs={'image': input_specs},
          max_pool_predictions=model_config.max_pool_predictions,
          dropout_rate=model_config.dropout_rate,
          kernel_regularizer=l2_regularizer)

  build.__doc__ = f"Model Garden 3-D model builder '{backbone_type}'."
  return build


build_assemblenet_backbone = backbone_factory.register_backbone_builder(
    'assemblenet')(_backbone_builder('assemblenet'))
build_assemblenet_plus_backbone = backbone_factory.register_backbone_builder(
    'assemblenet_plus')(_backbone_builder('assemblenet_plus'))
build_assemblenet_model = factory_3d.register_model_builder('assemblenet')(
    _model_builder('assemblenet'))
build_assemblenet_plus_model = factory_3d.register_model_builder(
    'assemblenet_plus')(_model_builder('assemblenet_plus'))
