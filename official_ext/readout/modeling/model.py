"""The readout model: token embedding, shared encoder, query decoder and
routed heads; its variable names are part of its interface (docs/readout.md,
The model)."""
import functools
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.readout import configs
from official_ext.readout import unit_vocabulary as vocabulary_lib
from official_ext.readout.modeling import layers
from official_ext.readout.modeling import multitask_readout

ModelConfig = Union[configs.ReadoutModel, Mapping[str, Any]]
# POYO's `emb_init_scale`: the standard deviation of its embeddings.
POYO_EMBEDDING_STDDEV = 0.02


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

  `model(inputs, training)` takes a `dataloader` batch dict (padded or
  chained queries) and returns {task: float [queries_of_task, dim]} in
  row-major (sample, query) order, every head present; with `static_shapes`
  {task: (outputs [..., dim], mask bool [...])}.
  """

  def __init__(self,
               model_config: ModelConfig,
               readouts: Sequence[Any],
               task_vocabulary: Sequence[str],
               input_dim: int,
               encoder: Optional[layers.TokenEncoder] = None,
               units: Optional[Union[vocabulary_lib.Vocabulary,
                                     Mapping[str, Any]]] = None,
               **kwargs):
    """Builds the model.

    Args:
      model_config: `configs.ReadoutModel` or its dict.
      readouts: the ReadoutSpecs (or dicts) of the heads to build.
      task_vocabulary: task names; routing id = 1 + position.
      input_dim: feature width of the input tokens.
      encoder: a `TokenEncoder` to share; None builds one.
      units: the unit vocabulary (or its dict) that sizes unit-token tables.
      **kwargs: `tf_keras.Model` arguments.
    """
    super().__init__(**kwargs)
    params = _as_config(model_config)
    specs = multitask_readout.normalize_specs(readouts)
    configs.validate_readouts(list(specs.values()), task_vocabulary)
    self._params = params
    if params.tokenization not in configs.TOKENIZATIONS:
      raise ValueError(f'model.tokenization is {params.tokenization!r}; '
                       f'expected one of {configs.TOKENIZATIONS}.')
    self.tokenization = params.tokenization
    if isinstance(units, Mapping):
      units = vocabulary_lib.from_names(units['sessions'], units['units'])
    if self.tokenization == 'unit_tokens':
      if units is None:
        raise ValueError("model.tokenization is 'unit_tokens' but no unit "
                         'vocabulary is given (task.vocabulary_file).')
      if int(input_dim) != 1:
        raise ValueError(f'input_dim is {input_dim}; unit tokens carry one '
                         'value each (DataConfig.input_dim 1).')
    else:
      units = None
    if params.unit_token_variant not in configs.UNIT_TOKEN_VARIANTS:
      raise ValueError(f'model.unit_token_variant is '
                       f'{params.unit_token_variant!r}; expected one of '
                       f'{configs.UNIT_TOKEN_VARIANTS}.')
    self.units = units
    # The variant of a unit-token model (None: binned, which has neither).
    self.unit_token_variant = (None if units is None else
                               params.unit_token_variant)
    poyo = self.unit_token_variant == 'poyo'
    # Plain python containers (not tracked as checkpoint dependencies).
    self._self_setattr_tracking = False
    self._config_dict = dict(
        model_config=params.as_dict(),
        readouts=[s.as_dict() for s in specs.values()],
        task_vocabulary=list(task_vocabulary), input_dim=input_dim)
    if units is not None:
      self._config_dict['units'] = units.as_dict()
    self._self_setattr_tracking = True
    enc = params.encoder
    self.token_embedding = tf_keras.layers.Dense(enc.hidden_size,
                                                 name='token_embedding')
    if units is not None:
      table = (functools.partial(layers.PaddedEmbedding,
                                 stddev=POYO_EMBEDDING_STDDEV) if poyo
               else tf_keras.layers.Embedding)
      self.unit_embedding = table(units.num_unit_ids, enc.hidden_size,
                                  name='unit_embedding')
      self.session_embedding = table(units.num_session_ids, enc.hidden_size,
                                     name='session_embedding')
      self.unit_vocabulary = tf.Variable(
          vocabulary_lib.to_json(units), trainable=False,
          name='unit_vocabulary', dtype=tf.string)
      if poyo:
        self.unit_token_variant_record = tf.Variable(
            'poyo', trainable=False, name='unit_token_variant_record',
            dtype=tf.string)
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
        max_time_period=enc.max_time_period,
        embedding_stddev=POYO_EMBEDDING_STDDEV if poyo else None,
        name='decoder')
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
    tokens = self.embed_tokens(inputs)
    encoded, mask = self.encoder(tokens, inputs['input_timestamps'],
                                 inputs['input_mask'], training=training)
    index = inputs['output_readout_index']
    times = inputs['output_timestamps']
    session = None  # [B, H]: the session embedding of each sample's queries.
    if self.unit_token_variant == 'poyo':
      session = self.session_embedding(
          tf.cast(inputs['session_ids'], tf.int32))
    if 'output_batch_index' in inputs:
      batch_index = inputs['output_batch_index']
      if session is not None:
        session = tf.gather(session, tf.cast(batch_index, tf.int32))
      return self.decoder.call_varlen(index, times, batch_index, encoded,
                                      mask, query_embedding=session,
                                      training=training)
    if session is not None:
      session = tf.broadcast_to(
          session[:, None, :],
          tf.concat([tf.shape(index), tf.shape(session)[-1:]], 0))
    return self.decoder(index, times, encoded, mask, query_embedding=session,
                        training=training)

  def embed_tokens(self, inputs: Mapping[str, tf.Tensor]) -> tf.Tensor:
    """The input tokens' embeddings [B, n_in, H]."""
    tokens = self.token_embedding(inputs['input_values'])
    if self.units is None:
      return tokens
    for key in ('input_unit_ids', 'session_ids'):
      if key not in inputs:
        raise ValueError(f'A unit-token model got a batch without `{key}`; '
                         'read the records with the unit vocabulary '
                         '(dataloader.build_dataset(..., units=...)).')
    unit = self.unit_embedding(tf.cast(inputs['input_unit_ids'], tf.int32))
    tokens += tf.cast(unit, tokens.dtype)
    if self.unit_token_variant == 'poyo':
      return tokens
    session = self.session_embedding(tf.cast(inputs['session_ids'], tf.int32))
    return tokens + tf.cast(session, tokens.dtype)[:, None, :]

  def module_variables(self, module: str) -> List[tf.Variable]:
    """The trainable variables of a freezable module (`FREEZABLE_MODULES`)."""
    if module not in configs.FREEZABLE_MODULES:
      raise ValueError(f'task.freeze names {module!r}; expected among '
                       f'{configs.FREEZABLE_MODULES}.')
    latents = getattr(self.encoder, 'latents', None)
    if module in ('encoder', 'encoder_except_latents', 'latents'):
      found = [v for layer in (self.token_embedding, self.encoder)
               for v in layer.trainable_variables]
      if module == 'encoder':
        return found
      if latents is None and module == 'latents':
        raise ValueError("task.freeze names 'latents', which a model "
                         'without Perceiver latents '
                         '(model.encoder.num_latents 0) does not have.')
      return [v for v in found if (v is latents) == (module == 'latents')]
    layers_of = {'decoder': [self.decoder], 'readout': [self.readout],
                 'unit_embedding': [getattr(self, 'unit_embedding', None)],
                 'session_embedding': [getattr(self, 'session_embedding',
                                               None)]}[module]
    if None in layers_of:
      raise ValueError(f'task.freeze names {module!r}, which a model with '
                       f'tokenization {self.tokenization!r} does not have.')
    return [v for layer in layers_of for v in layer.trainable_variables]

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


def dummy_inputs(input_dim: int, batch_size: int = 1,
                 unit_tokens: bool = False) -> Dict[str, tf.Tensor]:
  """A padded batch of one token and one padding query (builds variables);
  `unit_tokens`: with unit and session id 0 (padding)."""
  inputs = {
      'input_values': tf.zeros([batch_size, 1, input_dim]),
      'input_timestamps': tf.zeros([batch_size, 1]),
      'input_mask': tf.ones([batch_size, 1], tf.bool),
      'output_readout_index': tf.zeros([batch_size, 1], tf.int32),
      'output_timestamps': tf.zeros([batch_size, 1]),
  }
  if unit_tokens:
    inputs['input_unit_ids'] = tf.zeros([batch_size, 1], tf.int32)
    inputs['session_ids'] = tf.zeros([batch_size], tf.int32)
  return inputs


def build_model(task_config: configs.ReadoutTaskConfig,
                readouts: Optional[Sequence[configs.ReadoutSpec]] = None,
                encoder: Optional[layers.TokenEncoder] = None,
                units: Optional[vocabulary_lib.Vocabulary] = None
                ) -> ReadoutModel:
  """Builds the task's model (all heads, or `readouts`) and its variables;
  `units`: the unit vocabulary of unit tokens."""
  model = ReadoutModel(
      task_config.model,
      readouts=list(task_config.readouts if readouts is None else readouts),
      task_vocabulary=list(task_config.task_vocabulary),
      input_dim=task_config.train_data.input_dim,
      encoder=encoder, units=units)
  model(dummy_inputs(model.input_dim, unit_tokens=model.units is not None),
        training=False)
  return model


_VOCABULARY_KEY = 'model/unit_vocabulary/.ATTRIBUTES/VARIABLE_VALUE'
_VARIANT_KEY = ('model/unit_token_variant_record/.ATTRIBUTES/'
                'VARIABLE_VALUE')


def checkpoint_variant(checkpoint_path: str) -> Optional[str]:
  """The `model.unit_token_variant` of a checkpoint's unit-token model
  (None: a binned model)."""
  names = dict(tf.train.list_variables(checkpoint_path))
  if _VOCABULARY_KEY not in names:
    return None
  if _VARIANT_KEY not in names:
    return 'session_per_token'
  value = tf.train.load_variable(checkpoint_path, _VARIANT_KEY)
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def check_checkpoint_variant(model: ReadoutModel, checkpoint_path: str,
                             where: str) -> None:
  """ValueError naming `task.model.unit_token_variant`, both values and
  `where` if the checkpoint's unit-token model is of another variant."""
  stored = checkpoint_variant(checkpoint_path)
  if stored is None or model.unit_token_variant is None:
    return
  if stored != model.unit_token_variant:
    raise ValueError(
        f'{where} {checkpoint_path} was written by a unit-token model with '
        f'task.model.unit_token_variant {stored!r}; this model is '
        f'{model.unit_token_variant!r}. Set '
        f'task.model.unit_token_variant={stored} to use the checkpoint (its '
        'params.yaml records the variant, or lacks the key: '
        "'session_per_token').")


def checkpoint_vocabulary(checkpoint_path: str
                          ) -> Optional[vocabulary_lib.Vocabulary]:
  """The unit vocabulary a checkpoint's model was trained with (its
  `unit_vocabulary` variable); None for a binned model's checkpoint."""
  names = dict(tf.train.list_variables(checkpoint_path))
  if _VOCABULARY_KEY not in names:
    return None
  text = tf.train.load_variable(checkpoint_path, _VOCABULARY_KEY)
  if isinstance(text, bytes):
    text = text.decode('utf-8')
  return vocabulary_lib.from_json(
      text, where=f'the unit vocabulary of checkpoint {checkpoint_path}')


def initialize_from(model: ReadoutModel, task_config, checkpoint_path: str
                    ) -> Optional[vocabulary_lib.Vocabulary]:
  """Restores `model` strictly from `checkpoint_path` (a prefix or a
  directory), the unit and session tables allowed to grow: their checkpoint
  rows copied, new rows kept. Returns the checkpoint's vocabulary (None:
  binned).

  Raises:
    ValueError: naming the checkpoint: none in a directory, a vocabulary
      that is not a prefix of the model's, or tokenizations that differ.
    AssertionError: a variable is missing from the checkpoint or has
      another shape.
  """
  if tf.io.gfile.isdir(checkpoint_path):
    latest = tf.train.latest_checkpoint(checkpoint_path)
    if latest is None:
      raise ValueError(f'task.init_checkpoint: no checkpoint in directory '
                       f'{checkpoint_path}.')
    checkpoint_path = latest
  old_units = checkpoint_vocabulary(checkpoint_path)
  if (old_units is None) != (model.units is None):
    raise ValueError(
        f'task.init_checkpoint {checkpoint_path}: the checkpoint\'s model '
        f'{"has no" if old_units is None else "has a"} unit vocabulary, the '
        f'model has tokenization {model.tokenization!r}.')
  if old_units is not None:
    problem = vocabulary_lib.is_prefix(old_units, model.units)
    if problem:
      raise ValueError(
          f'task.init_checkpoint {checkpoint_path}: its unit vocabulary is '
          f'not a prefix of task.vocabulary_file\'s ({problem}); a grown '
          'vocabulary appends names and never renumbers.')
  check_checkpoint_variant(model, checkpoint_path, 'task.init_checkpoint')
  source = build_model(task_config, readouts=list(model.readout_specs.values()),
                       units=old_units)
  status = tf.train.Checkpoint(model=source).read(checkpoint_path)
  status.expect_partial()
  status.assert_existing_objects_matched()
  grown = {}
  if old_units is not None:
    grown = {id(source.unit_embedding.embeddings): 'unit',
             id(source.session_embedding.embeddings): 'session'}
  for old, new in zip(source.variables, model.variables):
    if old.dtype == tf.string:
      continue  # The vocabulary: the model keeps its own (grown) one.
    if id(old) in grown:
      rows = old.shape[0]
      new.assign(tf.concat([old, new[rows:]], 0))
    else:
      new.assign(old)
  return old_units


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
                           checkpoint_path: str,
                           units: Optional[vocabulary_lib.Vocabulary] = None
                           ) -> ReadoutModel:
  """The model of `task_config` with only `task_name`'s head, restored from
  a multitask (or joint) checkpoint (a prefix or a directory).

  Raises:
    ValueError: the task has no spec, or the checkpoint has no such head.
    AssertionError: a variable of the model is not in the checkpoint.
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
  model = build_model(task_config, readouts=[specs[task_name]], units=units)
  check_checkpoint_variant(model, checkpoint_path, 'The checkpoint')
  path = [p for p in _checkpoint_prefix(checkpoint_path,
                                        task_name).split('/') if p]
  root = model
  for part in reversed(path):
    root = tf.train.Checkpoint(**{part: root})
  status = root.read(checkpoint_path)
  status.expect_partial()
  status.assert_existing_objects_matched()
  return model
