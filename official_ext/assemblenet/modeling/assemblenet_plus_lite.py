"""AssembleNet++lite (Ryoo et al., ECCV 2020) in tf_keras, registered with Model
Garden's factories: backbone builder 'assemblenet_plus_lite' ([B, T, H, W, 3]
-> endpoints {'node_<i>', 'output'}) and 3-D model builder
'assemblenet_plus_lite' ({'image': clips} -> logits [B, num_classes]); its
differences from the TF1 code: docs/assemblenet.md#the-network."""
import contextlib
import json
from typing import Any, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras

from official.vision.modeling import factory_3d
from official.vision.modeling.backbones import factory as backbone_factory
from official_ext.assemblenet import structures
from official_ext.assemblenet.modeling import blocks
from official_ext.assemblenet.modeling import convolutions
from official_ext.assemblenet.modeling import fusion
from official_ext.assemblenet.modeling import recompute
from official_ext.assemblenet.modeling import representation_flow

layers = tf_keras.layers


@contextlib.contextmanager
def _policy(precision: str):
  """Sets the global Keras dtype policy while layers are created."""
  if not precision:
    yield
    return
  names = {'float32': 'float32', 'bfloat16': 'mixed_bfloat16',
           'float16': 'mixed_float16'}
  if precision not in names:
    raise ValueError(f"precision must be '', 'float32', 'bfloat16' or "
                     f"'float16'; got {precision!r}.")
  old = tf_keras.mixed_precision.global_policy()
  tf_keras.mixed_precision.set_global_policy(names[precision])
  try:
    yield
  finally:
    tf_keras.mixed_precision.set_global_policy(old)


class LiteStem(layers.Layer):
  """[1, 3, 3] conv stride 2 (BN, ReLU), then a [3, 1, 1] temporal conv (BN,
  ReLU), `filters` channels each: [B, T, H, W, C] -> [B, T, H/2, W/2,
  filters]; with `recompute_grad` training calls run through
  `recompute.recompute_grad`."""

  def __init__(self, filters: int, temporal_dilation: int = 1,
               bn_decay: float = blocks.BATCH_NORM_DECAY,
               bn_epsilon: float = blocks.BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None,
               recompute_grad: bool = False, **kwargs):
    super().__init__(**kwargs)
    temporal_dilation = max(int(temporal_dilation), 1)
    self._args = dict(filters=filters, temporal_dilation=temporal_dilation,
                      bn_decay=bn_decay, bn_epsilon=bn_epsilon,
                      use_sync_bn=use_sync_bn, recompute_grad=recompute_grad)
    bn = dict(bn_decay=bn_decay, bn_epsilon=bn_epsilon,
              use_sync_bn=use_sync_bn)
    temporal_init = None
    if temporal_dilation > 1:
      temporal_init = tf_keras.initializers.TruncatedNormal(
          stddev=float(np.sqrt(2.0 / (3 * filters))))
    self._conv = convolutions.conv3d_same_padding(
        filters, 3, 2, do_2d_conv=True, kernel_regularizer=kernel_regularizer,
        name='conv')
    self._bn = blocks.BatchNormRelu(name='bn', **bn)
    self._temporal = convolutions.conv3d_same_padding(
        filters, [3, 1, 1], 1, temporal_dilation,
        kernel_initializer=temporal_init,
        kernel_regularizer=kernel_regularizer, name='conv_temporal')
    self._temporal_bn = blocks.BatchNormRelu(name='bn_temporal', **bn)

  def call(self, inputs, training=None):
    if self._args['recompute_grad'] and training is True:
      return recompute.recompute_grad(
          lambda x: self._forward(x, True))(inputs)
    return self._forward(inputs, training)

  def _forward(self, inputs, training):
    x = self._bn(self._conv(inputs), training=training)
    return self._temporal_bn(self._temporal(x), training=training)

  def get_config(self):
    config = super().get_config()
    config.update(self._args)
    return config


def _checked(model_structure, model_edge_weights, blocks_per_level,
             attention_mode, input_specs):
  """(structure, edge weights, input shape) of the backbone's arguments,
  checked."""
  if model_structure is None:
    model_structure = structures.ASSEMBLENET_PLUS_LITE_STRUCTURE
  structure = structures.validate_structure(
      model_structure, model_edge_weights, blocks_per_level)
  edge_weights = structures.normalize_edge_weights(model_edge_weights)
  if attention_mode not in fusion.ATTENTION_MODES:
    raise ValueError(f'attention_mode must be None, "self" or "peer"; got '
                     f'{attention_mode!r}.')
  for i, node in enumerate(structure):
    if node[0] == structures.STEM_OBJECT:
      raise ValueError(
          f'model structure node {i} ({node!r}) is an object-input stem '
          '(-3): this model takes only RGB clips (flow is computed from '
          'them); object segmentation inputs are not supported.')
  if input_specs is None:
    input_specs = layers.InputSpec(shape=[None, 32, 224, 224, 3])
  shape = list(input_specs.shape)
  if len(shape) != 5 or None in shape[2:]:
    raise ValueError('AssembleNet++lite needs input shape [batch, T, H, W, '
                     f'C] with static H, W and C (T may be None); got '
                     f'{shape}.')
  if shape[1] is not None:
    structures.check_num_frames(structure, shape[1], f'input_specs {shape}')
  return structure, edge_weights, shape


def _flow(structure, inputs, rep_flow_options):
  """The flow stem's input (the clips' representation flow, in the clips'
  dtype), or None without a flow stem."""
  if not any(n[0] == structures.STEM_FLOW for n in structure):
    return None
  flow = representation_flow.RepresentationFlow(
      name='rep_flow', **rep_flow_options)(inputs)
  return tf.cast(flow, inputs.dtype) if flow.dtype != inputs.dtype else flow


class _Nodes:
  """Builds the backbone's nodes in order: stems, then each block node's
  fusion (of its inputs, pooled, and its peers' means) and block group."""

  def __init__(self, structure, edge_weights, blocks_per_level, stem_filters,
               attention_mode, fusion_width_as_channels, recompute_grad,
               kernel_regularizer, share_fusion_inputs, bn):
    self.structure, self.edge_weights = structure, edge_weights
    self.blocks_per_level, self.stem_filters = blocks_per_level, stem_filters
    self.attention_mode = attention_mode
    self.fusion_width_as_channels = fusion_width_as_channels
    self.recompute_grad = recompute_grad
    self.kernel_regularizer = kernel_regularizer
    self.share_fusion_inputs = share_fusion_inputs
    self.bn = bn
    self.streams = []
    self.shared: Dict[Any, Any] = {}  # (node, 'mean') / (node, ratio) -> x

  def build(self, inputs, flow) -> Dict[str, Any]:
    """{'node_<i>': every node's output, 'output': the first level-3
    node's}."""
    endpoints = {}
    for i, node in enumerate(self.structure):
      if node[0] < 0:
        out = self.stem(i, node, flow if node[0] == structures.STEM_FLOW
                        else inputs)
      else:
        out = self.block_node(i, node)
      self.streams.append(out)
      endpoints[f'node_{i}'] = out
    first_top = next(i for i, n in enumerate(self.structure) if n[0] == 3)
    endpoints['output'] = self.streams[first_top]
    return endpoints

  def stem(self, i, node, x):
    return LiteStem(self.stem_filters, node[1],
                    kernel_regularizer=self.kernel_regularizer,
                    recompute_grad=self.recompute_grad, name=f'node_{i}',
                    **self.bn)(x)

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
    fused = fusion.PeerAttentionFusion(
        num_inputs=len(node_inputs), attention_mode=self.attention_mode,
        edge_weights=weights,
        fusion_width_as_channels=self.fusion_width_as_channels,
        kernel_regularizer=self.kernel_regularizer,
        recompute_grad=self.recompute_grad,
        name=f'node_{i}_fusion')(node_inputs + peers)
    return blocks.BlockGroup(
        filters, self.blocks_per_level[level], stride, dilation,
        recompute_grad=self.recompute_grad,
        kernel_regularizer=self.kernel_regularizer, name=f'node_{i}',
        **self.bn)(fused)

  def peer(self, k):
    """Node k's peer-attention source: its spatial mean, once."""
    if not self.share_fusion_inputs:
      return self.streams[k]
    if (k, 'mean') not in self.shared:
      self.shared[k, 'mean'] = fusion.SpatialMean(
          name=f'node_{k}_mean')(self.streams[k])
    return self.shared[k, 'mean']

  def pooled(self, input_ids):
    """The nodes' outputs, each max-pooled (once) to the smallest one's size
    as the fusion pools them: ratio (H + 1) // H_min."""
    xs = [self.streams[j] for j in input_ids]
    if not self.share_fusion_inputs or self.fusion_width_as_channels:
      return xs
    h_min = min(x.shape[2] for x in xs)
    w_min = min(x.shape[3] for x in xs)
    out = []
    for j, x in zip(input_ids, xs):
      if x.shape[2] == h_min and x.shape[3] == w_min:
        out.append(x)
        continue
      out.append(self.pool(j, x, (x.shape[2] + 1) // h_min))
    return out

  def pool(self, j, x, r):
    # Node j's output x max-pooled by r, once. Where r is even and divides
    # the frame, it is the 2 x 2 max pool of the copy pooled by r / 2: the
    # same values (a max over an r x r window is the max of its four
    # r/2 x r/2 maxima), and the backward pass adds this copy's gradient
    # into the smaller copy's instead of making one more full-size
    # gradient of x.
    if (j, r) not in self.shared:
      h, w = x.shape[2], x.shape[3]
      if r > 2 and r % 2 == 0 and h % r == 0 and w % r == 0:
        source, ratio = self.pool(j, x, r // 2), 2
      else:
        source, ratio = x, r
      self.shared[j, r] = fusion.SpatialMaxPool(
          ratio, name=f'node_{j}_pool_{r}')(source)
    return self.shared[j, r]


class AssembleNetPlusLite(tf_keras.Model):
  """The AssembleNet++lite backbone (functional tf_keras.Model): [B, T, H, W,
  3] float -> {'node_<i>': [B, T, H_i, W_i, C_i] of every node, 'output': the
  first level-3 node's}.

  Args:
    model_structure: node list or its JSON (`structures`).
    model_edge_weights: per-node edge weights (or JSON); None / '' / '[]'
      make every fusion's edge weights trainable.
    blocks_per_level: blocks per block group for levels 0..3.
    input_specs: InputSpec of [B, T, H, W, 3], H and W static (the fusions'
      pooling ratios are fixed when built); T None takes any frame count the
      structure allows (`structures.min_num_frames`), checked by the flow
      stem when called.
    stem_filters: filters of every stem (24 in the original).
    attention_mode: None, 'self' or 'peer'.
    fusion_width_as_channels: the original's width-as-channels fusion.
    bn_decay, bn_epsilon, use_sync_bn: batch norm settings.
    recompute_grad: gradient checkpointing of every stem, fusion and block
      group (`recompute.recompute_grad`).
    rep_flow_options: kwargs of `representation_flow.RepresentationFlow`.
    kernel_regularizer: regularizer of every conv / dense kernel.
    share_fusion_inputs: each node's spatial mean and max-pooled copies
      computed once for every fusion that reads them (an even ratio from the
      copy of half that ratio; not with `fusion_width_as_channels`): the same
      values, one full-size gradient per shared tensor instead of one per
      fusion."""

  def __init__(self,
               model_structure: Any = None,
               model_edge_weights: Any = None,
               blocks_per_level: Sequence[int] = (
                   structures.ASSEMBLENET_PLUS_LITE_BLOCKS_PER_LEVEL),
               input_specs: Optional[layers.InputSpec] = None,
               stem_filters: int = 24,
               attention_mode: Optional[str] = 'peer',
               fusion_width_as_channels: bool = False,
               bn_decay: float = blocks.BATCH_NORM_DECAY,
               bn_epsilon: float = blocks.BATCH_NORM_EPSILON,
               use_sync_bn: bool = False,
               recompute_grad: bool = False,
               rep_flow_options: Optional[Dict[str, Any]] = None,
               kernel_regularizer=None,
               share_fusion_inputs: bool = True,
               **kwargs):
    structure, edge_weights, shape = _checked(
        model_structure, model_edge_weights, blocks_per_level,
        attention_mode, input_specs)
    rep_flow_options = dict(rep_flow_options or {})
    inputs = tf_keras.Input(shape=shape[1:], batch_size=shape[0],
                            name='image')
    nodes = _Nodes(
        structure, edge_weights, blocks_per_level, stem_filters,
        attention_mode, fusion_width_as_channels, recompute_grad,
        kernel_regularizer, share_fusion_inputs,
        dict(bn_decay=bn_decay, bn_epsilon=bn_epsilon,
             use_sync_bn=use_sync_bn))
    endpoints = nodes.build(inputs, _flow(structure, inputs,
                                          rep_flow_options))
    super().__init__(inputs=inputs, outputs=endpoints, **kwargs)
    self._config_dict = dict(
        model_structure=json.dumps(structure),
        model_edge_weights=(json.dumps(edge_weights) if edge_weights else ''),
        blocks_per_level=list(blocks_per_level),
        input_specs=shape, stem_filters=stem_filters,
        attention_mode=attention_mode,
        fusion_width_as_channels=fusion_width_as_channels,
        bn_decay=bn_decay, bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn,
        recompute_grad=recompute_grad, rep_flow_options=rep_flow_options,
        share_fusion_inputs=share_fusion_inputs,
        kernel_regularizer=(tf_keras.regularizers.serialize(
            tf_keras.regularizers.get(kernel_regularizer))
                            if kernel_regularizer else None))
    self._structure = structure
    self._output_specs = {k: v.shape for k, v in endpoints.items()}

  @property
  def structure(self):
    return self._structure

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


class LiteHead(layers.Layer):
  """The lite head: 1x1x1 conv to filters[0] and one to filters[1] (each BN,
  ReLU), pooling, dropout, a dense layer to num_classes (normal(0.01) init,
  float32 output): [B, T, H, W, C] -> float32 logits [B, num_classes]. Pooling
  is the global average, or with `max_pool_predictions` per-frame logits
  summed with softmax_t(logits_t / sqrt(T)) weights."""

  def __init__(self, num_classes: int, filters: Sequence[int] = (432, 2048),
               max_pool_predictions: bool = False, dropout_rate: float = 0.0,
               bn_decay: float = blocks.BATCH_NORM_DECAY,
               bn_epsilon: float = blocks.BATCH_NORM_EPSILON,
               use_sync_bn: bool = False, kernel_regularizer=None, **kwargs):
    super().__init__(**kwargs)
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f'dropout_rate is a drop rate in [0, 1); got '
                       f'{dropout_rate}.')
    if len(filters) != 2:
      raise ValueError(f'head filters must be 2 ints; got {list(filters)}.')
    self._args = dict(num_classes=num_classes, filters=list(filters),
                      max_pool_predictions=max_pool_predictions,
                      dropout_rate=dropout_rate, bn_decay=bn_decay,
                      bn_epsilon=bn_epsilon, use_sync_bn=use_sync_bn)
    bn = dict(bn_decay=bn_decay, bn_epsilon=bn_epsilon,
              use_sync_bn=use_sync_bn)
    self._conv1 = convolutions.conv3d_same_padding(
        filters[0], 1, kernel_regularizer=kernel_regularizer, name='last_conv')
    self._bn1 = blocks.BatchNormRelu(name='last_conv_bn', **bn)
    self._conv2 = convolutions.conv3d_same_padding(
        filters[1], 1, kernel_regularizer=kernel_regularizer,
        name='last_conv2')
    self._bn2 = blocks.BatchNormRelu(name='last_conv2_bn', **bn)
    self._dropout = layers.Dropout(dropout_rate)
    self._dense = layers.Dense(
        num_classes, kernel_initializer=tf_keras.initializers.RandomNormal(
            stddev=0.01), kernel_regularizer=kernel_regularizer,
        dtype='float32', name='final_dense')

  def embedding(self, inputs, training=None):
    """The pre-logit feature the dense layer reads: float32 [B, filters[1]],
    the second conv's output (BN, ReLU) averaged over (T, H, W)."""
    x = self._bn1(self._conv1(inputs), training=training)
    x = self._bn2(self._conv2(x), training=training)
    return tf.cast(tf.reduce_mean(x, axis=[1, 2, 3]), tf.float32)

  def call(self, inputs, training=None):
    x = self._bn1(self._conv1(inputs), training=training)
    x = self._bn2(self._conv2(x), training=training)
    if self._args['max_pool_predictions']:
      x = tf.reduce_mean(x, axis=[2, 3])  # [B, T, C]
    else:
      x = tf.reduce_mean(x, axis=[1, 2, 3])  # [B, C]
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


class AssembleNetPlusLiteModel(tf_keras.Model):
  """Backbone + `LiteHead`: {'image': [B, T, H, W, 3]} -> logits [B, K]."""

  def __init__(self, backbone: AssembleNetPlusLite, num_classes: int,
               input_specs: Optional[Dict[str, layers.InputSpec]] = None,
               head_filters: Sequence[int] = (432, 2048),
               max_pool_predictions: bool = False, dropout_rate: float = 0.0,
               kernel_regularizer=None, **kwargs):
    if input_specs is None:
      input_specs = {'image': layers.InputSpec(
          shape=[None] + list(backbone.input_shape[1:]))}
    shape = list(input_specs['image'].shape)
    inputs = {'image': tf_keras.Input(shape=shape[1:], batch_size=shape[0],
                                      name='image')}
    features = backbone(inputs['image'])['output']
    head = LiteHead(num_classes, head_filters, max_pool_predictions,
                    dropout_rate, bn_decay=backbone.get_config()['bn_decay'],
                    bn_epsilon=backbone.get_config()['bn_epsilon'],
                    use_sync_bn=backbone.get_config()['use_sync_bn'],
                    kernel_regularizer=kernel_regularizer, name='head')
    logits = head(features)
    super().__init__(inputs=inputs, outputs=logits, **kwargs)
    self._backbone = backbone
    self._head = head
    self._config_dict = dict(num_classes=num_classes,
                             head_filters=list(head_filters),
                             max_pool_predictions=max_pool_predictions,
                             dropout_rate=dropout_rate)

  @property
  def backbone(self):
    return self._backbone

  @property
  def head(self) -> LiteHead:
    return self._head

  @property
  def checkpoint_items(self):
    return dict(backbone=self._backbone, head=self._head)

  def get_config(self):
    return dict(self._config_dict)


def build_backbone_from_config(input_specs, backbone_config,
                               kernel_regularizer=None
                               ) -> AssembleNetPlusLite:
  """The backbone of an `AssembleNetPlusLite` config (structure and edge
  weights inline or from their `*_path` files)."""
  c = backbone_config
  structure, edge_weights = structures.from_backbone_config(
      c, prefix=structures.backbone_key('assemblenet_plus_lite'))
  with _policy(c.precision):
    return AssembleNetPlusLite(
        model_structure=structure,
        model_edge_weights=edge_weights,
        blocks_per_level=tuple(c.blocks_per_level),
        input_specs=input_specs,
        stem_filters=c.stem_filters,
        attention_mode=c.attention_mode or None,
        fusion_width_as_channels=c.fusion_width_as_channels,
        bn_decay=c.bn_decay, bn_epsilon=c.bn_epsilon,
        use_sync_bn=c.use_sync_bn, recompute_grad=c.recompute_grad,
        rep_flow_options=c.rep_flow.as_dict(),
        kernel_regularizer=kernel_regularizer)


@backbone_factory.register_backbone_builder('assemblenet_plus_lite')
def build_assemblenet_plus_lite_backbone(
    input_specs: layers.InputSpec, backbone_config, norm_activation_config,
    l2_regularizer=None) -> AssembleNetPlusLite:
  """Model Garden backbone builder 'assemblenet_plus_lite'; the batch-norm
  settings come from the backbone config, not `norm_activation_config`."""
  del norm_activation_config
  if backbone_config.type != 'assemblenet_plus_lite':
    raise ValueError(f'backbone type {backbone_config.type!r} is not '
                     "'assemblenet_plus_lite'.")
  return build_backbone_from_config(input_specs, backbone_config.get(),
                                    l2_regularizer)


@factory_3d.register_model_builder('assemblenet_plus_lite')
def build_assemblenet_plus_lite_model(
    input_specs: layers.InputSpec, model_config, num_classes: int,
    l2_regularizer=None) -> AssembleNetPlusLiteModel:
  """Model Garden 3-D model builder ('assemblenet_plus_lite')."""
  backbone = backbone_factory.build_backbone(
      input_specs=input_specs, backbone_config=model_config.backbone,
      norm_activation_config=None, l2_regularizer=l2_regularizer)
  precision = model_config.backbone.get().precision
  with _policy(precision):
    return AssembleNetPlusLiteModel(
        backbone, num_classes,
        input_specs={'image': input_specs},
        head_filters=tuple(model_config.head_filters),
        max_pool_predictions=model_config.max_pool_predictions,
        dropout_rate=model_config.dropout_rate,
        kernel_regularizer=l2_regularizer)
