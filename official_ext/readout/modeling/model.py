"""The readout model: token embedding, shared encoder, query decoder, readout.

Variable (and checkpoint) names are part of the interface:

* `token_embedding/`: this family's input projection (input_dim -> hidden).
* `encoder/`: the shared `TokenEncoder` (the same object in every model that
  shares it).
* `decoder/`: the query decoder, incl. `task_embedding` (one row per routing
  id of the vocabulary, so single- and multi-task models share its shape).
* `readout/projections/<task>/kernel|bias`: one head per task.

A single-task model built from the same config with one ReadoutSpec has the
same names with one head, which is how `graft_single_task_head` restores it
from a multitask checkpoint.
"""
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import tensorflow as tf, tf_keras

from official_ext.readout import configs
from official_ext.readout.modeling import layers
from official_ext.readout.modeling import multitask_readout

ModelConfig = Union[configs.ReadoutModel, Mapping[str, Any]]


def _as_config(model_config: ModelConfig) -> configs.ReadoutModel:
  if isinstance(model_config, configs.ReadoutModel):
    return model_config
  config = configs.ReadoutModel()
  config.override(dict(model_config), is_strict=True)
  return config


def build_encoder(encoder_config: configs.Encoder,
                  name: str = 'encoder') -> layers.TokenEncoder:
  """The shared encoder from its config."""
  return layers.TokenEncoder(name=name, **encoder_config.as_dict())


class ReadoutModel(tf_keras.Model):
  """Timestamped input tokens + readout queries -> per-task predictions.

  Call `model(inputs, training=None)` with a batch dict of `dataloader`:
  `input_values` float [B, n_in, input_dim], `input_timestamps` [B, n_in],
  `input_mask` bool [B, n_in], `output_readout_index` int, `output_timestamps`
  float, either padded ([B, n_out]) or chained ([N], with
  `output_batch_index` int [N]).

  Returns {task: float [queries_of_task, dim]} (rows in row-major (sample,
  query) order; every head present, possibly with 0 rows); with
  `static_shapes`, {task: (outputs [B, n_out, dim] or [N, dim], mask bool
  [B, n_out] or [N])}.
  """

  def __init__(self,
               model_config: ModelConfig,
               readouts: Sequence[Any],
               task_vocabulary: Sequence[str],
               input_dim: int,
               encoder: Optional[layers.TokenEncoder] = None,
               **kwargs):
    """Builds the model.

    Args:
      model_config: `configs.ReadoutModel` or its dict.
      readouts: the ReadoutSpecs (or dicts) of the heads to build.
      task_vocabulary: task names; routing id = 1 + position.
      input_dim: feature width of the input tokens.
      encoder: a `TokenEncoder` to share with other models; None builds one
        from `model_config.encoder`.
      **kwargs: `tf_keras.Model` arguments.
    """
    super().__init__(**kwargs)
    params = _as_config(model_config)
    specs = multitask_readout.normalize_specs(readouts)
    configs.validate_readouts(list(specs.values()), task_vocabulary)
    self._params = params
    # Plain python containers (not tracked as checkpoint dependencies).
    self._self_setattr_tracking = False
    self._config_dict = dict(
        model_config=params.as_dict(),
        readouts=[s.as_dict() for s in specs.values()],
        task_vocabulary=list(task_vocabulary), input_dim=input_dim)
    self._self_setattr_tracking = True
    enc = params.encoder
    self.token_embedding = tf_keras.layers.Dense(enc.hidden_size,
                                                 name='token_embedding')
    self.encoder = encoder if encoder is not None else build_encoder(enc)
    if self.encoder.hidden_size != enc.hidden_size:
      raise ValueError(f'The shared encoder has hidden_size '
                       f'{self.encoder.hidden_size}; model.encoder.hidden_size '
                       f'is {enc.hidden_size}.')
    self.decoder = layers.QueryDecoder(
        num_task_ids=len(task_vocabulary) + 1, hidden_size=enc.hidden_size,
        num_heads=enc.num_heads, num_layers=params.decoder.num_layers,
        intermediate_size=enc.intermediate_size,
        dropout_rate=enc.dropout_rate, min_time_period=enc.min_time_period,
        max_time_period=enc.max_time_period, name='decoder')
    self.readout = multitask_readout.MultitaskReadout(
        specs, configs.task_index(task_vocabulary), name='readout')
    self.static_shapes = bool(params.static_shapes)
    self.input_dim = int(input_dim)

  @property
  def readout_specs(self) -> Dict[str, configs.ReadoutSpec]:
    return self.readout.readout_specs

  def output_embeddings(self, inputs: Mapping[str, tf.Tensor],
                        training=None) -> tf.Tensor:
    """Decoded query embeddings before the heads: [B, n_out, H] or [N, H]."""
    tokens = self.token_embedding(inputs['input_values'])
    encoded, mask = self.encoder(tokens, inputs['input_timestamps'],
                                 inputs['input_mask'], training=training)
    index = inputs['output_readout_index']
    times = inputs['output_timestamps']
    if 'output_batch_index' in inputs:
      return self.decoder.call_varlen(index, times,
                                      inputs['output_batch_index'], encoded,
                                      mask, training=training)
    return self.decoder(index, times, encoded, mask, training=training)

  def call(self, inputs: Mapping[str, tf.Tensor], training=None):
    embs = self.output_embeddings(inputs, training=training)
    index = inputs['output_readout_index']
    if self.static_shapes:
      return self.readout.call_static(embs, index)
    if 'output_batch_index' in inputs:
      return self.readout.call_varlen(embs, index,
                                      inputs['output_batch_index'])
    return self.readout(embs, index)

  def get_config(self) -> Dict[str, Any]:
    return dict(self._config_dict)

  @classmethod
  def from_config(cls, config, custom_objects=None):
    return cls(**config)

  @property
  def checkpoint_items(self) -> Dict[str, Any]:
    return dict(encoder=self.encoder, readout=self.readout)


def dummy_inputs(input_dim: int, batch_size: int = 1
                 ) -> Dict[str, tf.Tensor]:
  """A padded batch of one token and one padding query (builds variables)."""
  return {
      'input_values': tf.zeros([batch_size, 1, input_dim]),
      'input_timestamps': tf.zeros([batch_size, 1]),
      'input_mask': tf.ones([batch_size, 1], tf.bool),
      'output_readout_index': tf.zeros([batch_size, 1], tf.int32),
      'output_timestamps': tf.zeros([batch_size, 1]),
  }


def build_model(task_config: configs.ReadoutTaskConfig,
                readouts: Optional[Sequence[configs.ReadoutSpec]] = None,
                encoder: Optional[layers.TokenEncoder] = None
                ) -> ReadoutModel:
  """Builds the task's model (all heads, or `readouts`) and its variables."""
  model = ReadoutModel(
      task_config.model,
      readouts=list(task_config.readouts if readouts is None else readouts),
      task_vocabulary=list(task_config.task_vocabulary),
      input_dim=task_config.train_data.input_dim,
      encoder=encoder)
  model(dummy_inputs(model.input_dim), training=False)
  return model


def _checkpoint_prefix(checkpoint_path: str, task_name: str) -> str:
  """The object path of the model holding `readout/projections/<task>`."""
  pattern = re.compile(r'^(.*?)readout/projections/' + re.escape(task_name) +
                       r'/kernel/\.ATTRIBUTES/VARIABLE_VALUE$')
  names = [n for n, _ in tf.train.list_variables(checkpoint_path)]
  found = [m.group(1) for m in map(pattern.match, names) if m]
  if not found:
    heads = sorted({n.split('readout/projections/')[1].split('/')[0]
                    for n in names if 'readout/projections/' in n})
    raise ValueError(f'Checkpoint {checkpoint_path} has no head '
                     f'`readout/projections/{task_name}`; its heads: {heads}.')
  if len(found) > 1:
    raise ValueError(f'Checkpoint {checkpoint_path} has several models with '
                     f'a head `{task_name}`: {found}.')
  if not found[0]:
    # Model Garden's trainer also saves `model.checkpoint_items` (`encoder`,
    # `readout`) at the root, so the variables' keys (their first paths)
    # start there; the whole model is under `model/`.
    return 'model/'
  return found[0]


def graft_single_task_head(task_config: configs.ReadoutTaskConfig,
                           task_name: str,
                           checkpoint_path: str) -> ReadoutModel:
  """A single-task model restored from a multitask checkpoint.

  Builds the model of `task_config` with only the head of `task_name` and
  restores its token embedding, encoder, decoder and
  `readout/projections/<task_name>` from the checkpoint: one written by the
  readout task's trainer or `tf.train.Checkpoint(model=...)` (model under
  `model/`), or by the joint multitask trainer (under
  `model/_sub_tasks/<name>/`). Other
  heads in the checkpoint are ignored. Its predictions for the task equal the
  multitask model's.

  Args:
    task_config: the multitask model's task config.
    task_name: the head to keep.
    checkpoint_path: a checkpoint file prefix or a directory (its latest).

  Returns:
    The restored single-task `ReadoutModel`.

  Raises:
    ValueError: the task has no spec, or the checkpoint has no such head.
    AssertionError: a variable of the single-task model is not in the
      checkpoint (e.g. a different encoder size).
  """
  specs = {s.name: s for s in task_config.readouts}
  if task_name not in specs:
    raise ValueError(f'Task {task_name!r} has no ReadoutSpec in '
                     f'task.readouts {sorted(specs)}.')
  if tf.io.gfile.isdir(checkpoint_path):
    latest = tf.train.latest_checkpoint(checkpoint_path)
    if latest is None:
      raise ValueError(f'No checkpoint in directory {checkpoint_path}.')
    checkpoint_path = latest
  model = build_model(task_config, readouts=[specs[task_name]])
  path = [p for p in _checkpoint_prefix(checkpoint_path,
                                        task_name).split('/') if p]
  root = model
  for part in reversed(path):
    root = tf.train.Checkpoint(**{part: root})
  status = root.read(checkpoint_path)
  status.expect_partial()
  status.assert_existing_objects_matched()
  return model
