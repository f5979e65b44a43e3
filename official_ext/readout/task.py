"""The multitask readout task (`ReadoutTask`)."""
import functools
from typing import Any, Dict, List, Mapping, Optional, Tuple

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import base_task
from official.core import task_factory
from official_ext.core import gradients
from official_ext.core import host_gather
from official_ext.core.input import bad_records
from official_ext.core.input import eval_padding
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import demo_data
from official_ext.readout import losses as readout_losses
from official_ext.readout import metrics as readout_metrics
from official_ext.readout.modeling import model as model_lib
from official_ext.readout.modeling import multitask_readout
from official_ext.readout import unit_vocabulary as vocabulary_lib

_EVAL_KEY = 'readout_eval'
# The batch's trial mask (1: a real trial, 0: padding), for the trial count.
_TRIALS_KEY = 'readout_eval_trials'
# Evaluation batches of named sets (`configs.Evaluation.eval_sets`) carry
# int32 [B]: each trial's set, its position among the selected sets. Set
# names stay on the host (no string tensor enters a replica step).
SET_KEY = 'eval_set'
# The trials' set indices, for the per-set trial count.
_TRIAL_SETS_KEY = 'readout_eval_trial_sets'

Routed = Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor],
               Dict[str, tf.Tensor]]


def _loss_metric_name(task: str) -> str:
  return f'{task}_loss'


@task_factory.register_task_cls(configs.ReadoutTaskConfig)
class ReadoutTask(base_task.Task):
  """Routed per-task heads on a shared encoder (docs/readout.md).

  Trains on the weighted task losses (`losses`); evaluates every trial and
  reports the host metrics (`metrics`), per named evaluation set if any.
  """

  def __init__(self, params: configs.ReadoutTaskConfig, logging_dir=None,
               name=None):
    super().__init__(params, logging_dir=logging_dir, name=name)
    configs.validate_readouts(params.readouts, params.task_vocabulary)
    if params.loss_weighting not in configs.LOSS_WEIGHTINGS:
      raise ValueError(f'task.loss_weighting is {params.loss_weighting!r}; '
                       f'expected one of {configs.LOSS_WEIGHTINGS}.')
    evaluation = params.evaluation
    if evaluation.protocol not in readout_metrics.PROTOCOLS:
      raise ValueError(f'task.evaluation.protocol is {evaluation.protocol!r}; '
                       f'expected one of {readout_metrics.PROTOCOLS}.')
    if configs.stitching(evaluation) and not evaluation.stitch_resolution > 0:
      raise ValueError('task.evaluation.stitch_resolution is '
                       f'{evaluation.stitch_resolution}; expected seconds '
                       '> 0.')
    self._specs = {s.name: s for s in params.readouts}
    self._task_index = configs.task_index(params.task_vocabulary)
    self._eval_sets = configs.selected_eval_sets(params)
    self._eval_metrics = None
    self._validation_source = None  # Set by build_inputs.
    self._set_sources = {}  # {set name: the files read}, set by build_inputs.
    # Stitched evaluation: {metric prefix ('' without sets, else `<set>/`):
    # the session names of that evaluation's records} (build_inputs), and
    # the records without a session_id counted so far (aggregate_logs).
    self._session_names: Dict[str, List[str]] = {}
    self._record_offset = 0
    model_params = params.model
    if model_params.tokenization not in configs.TOKENIZATIONS:
      raise ValueError(f'task.model.tokenization is '
                       f'{model_params.tokenization!r}; expected one of '
                       f'{configs.TOKENIZATIONS}.')
    unknown = [m for m in params.freeze
               if m not in configs.FREEZABLE_MODULES]
    if unknown:
      raise ValueError(f'task.freeze names {unknown}; expected modules '
                       f'among {configs.FREEZABLE_MODULES}.')
    if int(params.unfreeze_step) < 0:
      raise ValueError(f'task.unfreeze_step is {params.unfreeze_step}; '
                       'expected a step >= 0 (0: frozen for the whole run).')
    if params.freeze and not params.init_checkpoint:
      raise ValueError(f'task.freeze is {list(params.freeze)} but '
                       'task.init_checkpoint is empty: frozen modules would '
                       'keep their random initialisation. Set '
                       'task.init_checkpoint, or task.freeze=[] to train '
                       'from scratch.')
    self._units: Optional[vocabulary_lib.Vocabulary] = None

  @property
  def readout_specs(self) -> Dict[str, configs.ReadoutSpec]:
    return dict(self._specs)

  @property
  def eval_set_names(self) -> Tuple[str, ...]:
    """The evaluation sets an evaluation reads, in order (() without
    named sets: it reads `task.validation_data`)."""
    return tuple(s.name for s in self._eval_sets)

  # -- model -----------------------------------------------------------------
  def unit_vocabulary(self) -> Optional[vocabulary_lib.Vocabulary]:
    """The unit vocabulary of unit tokens (None: binned), read once."""
    params = self.task_config
    if params.model.tokenization != 'unit_tokens':
      return None
    if self._units is None:
      path = params.vocabulary_file
      if not path:
        if not params.demo_data.enabled:
          raise ValueError(
              "task.model.tokenization is 'unit_tokens' and "
              'task.vocabulary_file is empty: point it at the vocabulary '
              'JSON of the records (official_ext.readout.unit_vocabulary).')
        path = demo_data.demo_vocabulary_file(params)
      self._units = vocabulary_lib.load(path)
    return self._units

  def build_model(self, encoder=None) -> model_lib.ReadoutModel:
    """The model with every head; `encoder`: a shared TokenEncoder."""
    model = model_lib.build_model(self.task_config, encoder=encoder,
                                  units=self.unit_vocabulary())
    self._check_run_vocabulary(model)
    logging.info('Readout model: %d heads, %d parameters.',
                 len(self._specs),
                 sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    return model

  def _check_run_vocabulary(self, model: model_lib.ReadoutModel) -> None:
    """ValueError unless a resumed unit-token run's checkpoint holds this
    vocabulary and `model.unit_token_variant`."""
    directory = self.logging_dir
    if model.units is None or not directory or not tf.io.gfile.isdir(
        directory):
      return
    latest = tf.train.latest_checkpoint(directory)
    if latest is None:
      return
    model_lib.check_checkpoint_variant(model, latest, 'The checkpoint')
    stored = model_lib.checkpoint_vocabulary(latest)
    if stored is not None and stored != model.units:
      raise ValueError(
          f'The checkpoint {latest} of this run was written with another '
          f'unit vocabulary ({len(stored.sessions)} sessions, '
          f'{len(stored.units)} units; first difference: '
          f'{vocabulary_lib.is_prefix(stored, model.units) or "longer"}) '
          f'than task.vocabulary_file ({self.task_config.vocabulary_file!r}); '
          'resume or evaluate it with its own vocabulary.')

  def initialize(self, model: model_lib.ReadoutModel):
    """Restores `task.init_checkpoint` strictly, the unit and session tables
    allowed to grow (`model.initialize_from`)."""
    path = self.task_config.init_checkpoint
    if not path:
      return
    old = model_lib.initialize_from(model, self.task_config, path)
    logging.info('Initialised the readout model from %s%s.', path,
                 '' if old is None else
                 f' ({len(old.units)} of {len(model.units.units)} units, '
                 f'{len(old.sessions)} of {len(model.units.sessions)} '
                 'sessions restored; the others initialised)')

  def _frozen_rows(self, module: str) -> Optional[int]:
    """Rows of a frozen embedding table that stay fixed: those of the ids
    of `task.init_checkpoint`'s vocabulary (+ padding row 0); None: all."""
    path = self.task_config.init_checkpoint
    if not path:
      return None
    if tf.io.gfile.isdir(path):
      path = tf.train.latest_checkpoint(path) or path
    old = model_lib.checkpoint_vocabulary(path)
    if old is None:
      return None
    return (old.num_unit_ids if module == 'unit_embedding' else
            old.num_session_ids)

  def freeze_gradients(self, model: model_lib.ReadoutModel, grads,
                       variables, step: tf.Tensor):
    """`grads` with the frozen modules' zeroed while `step` < unfreeze_step.

    A frozen unit or session table keeps the init_checkpoint's rows fixed
    and trains the rows the grown vocabulary added.
    """
    params = self.task_config
    if not params.freeze:
      return list(grads)
    unfreeze = int(params.unfreeze_step)
    frozen = (tf.constant(0.0) if unfreeze == 0 else
              tf.cast(step >= unfreeze, tf.float32))
    factors = {}  # id(variable) -> multiplier (scalar or [rows, 1]).
    for module in params.freeze:
      for v in model.module_variables(module):
        rows = (self._frozen_rows(module) if module.endswith('_embedding')
                else None)
        if rows is None:
          factors[id(v)] = frozen
        else:
          trained = tf.cast(tf.range(v.shape[0]) >= rows, tf.float32)
          factors[id(v)] = tf.maximum(trained, frozen)[:, None]
    out = []
    for g, v in zip(grads, variables):
      if g is None or id(v) not in factors:
        out.append(g)
        continue
      g = tf.convert_to_tensor(g)
      out.append(g * tf.cast(factors[id(v)], g.dtype))
    return out

  def build_single_task_model(self, task_name: str,
                              checkpoint_path: str) -> model_lib.ReadoutModel:
    """A one-head model grafted from a multitask checkpoint (see
    `model.graft_single_task_head`)."""
    return model_lib.graft_single_task_head(self.task_config, task_name,
                                            checkpoint_path,
                                            units=self.unit_vocabulary())

  # -- data ------------------------------------------------------------------
  def _resolve_input_path(self, params: configs.DataConfig, key: str,
                          demo_split: str) -> configs.DataConfig:
    """`params` with the generated `demo_split` as input when its
    `input_path` (config key `key`) is empty."""
    if params.input_path:
      return params
    if not self.task_config.demo_data.enabled:
      raise ValueError(f'{key} is empty: point it at readout TFRecords (see '
                       'official_ext.readout.dataloader for the schema), or '
                       'set task.demo_data.enabled=true for generated data.')
    if not demo_split:
      raise ValueError(f"{key} is empty and the set's demo_split is '': "
                       'set one of them.')
    pattern = demo_data.demo_split_pattern(self.task_config, demo_split)
    logging.info('%s is empty: using generated demo data %s', key, pattern)
    return params.replace(input_path=pattern)

  def validation_dataset(self) -> Tuple[str, Dict[str, Any]]:
    """(what the validation data is, the config keys that shape it), for
    the errors of an evaluation that saw no trial."""
    return eval_padding.describe_split(
        self.task_config.validation_data,
        resolved_input_path=self._validation_source)

  def _set_key(self, i: int) -> str:
    """The config key of the i-th selected set's data."""
    names = [s.name for s in self.task_config.evaluation.eval_sets]
    return (f'task.evaluation.eval_sets[{names.index(self._eval_sets[i].name)}]'
            '.data')

  def eval_set_dataset(self, i: int) -> Tuple[str, Dict[str, Any]]:
    """`validation_dataset` of the i-th selected evaluation set."""
    eval_set = self._eval_sets[i]
    dataset, settings = eval_padding.describe_split(
        eval_set.data, key=self._set_key(i),
        resolved_input_path=self._set_sources.get(eval_set.name))
    return f'evaluation set {eval_set.name!r}: {dataset}', settings

  def build_inputs(self, params: configs.DataConfig,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    """The batched split; with named evaluation sets, the selected sets'
    batches one set after the other, each tagged with `SET_KEY` int32 [B]."""
    if params.is_training or not self._eval_sets:
      split = 'train' if params.is_training else 'validation'
      demo = self.task_config.demo_data
      resolved = self._resolve_input_path(
          params, f'task.{split}_data.input_path',
          demo.train_split if params.is_training else demo.validation_split)
      if not params.is_training:
        self._validation_source = resolved.input_path
      return self._build_split(resolved, input_context, prefix='')
    combined = None
    for i, eval_set in enumerate(self._eval_sets):
      resolved = self._resolve_input_path(
          eval_set.data, f'{self._set_key(i)}.input_path ({eval_set.name!r})',
          eval_set.demo_split)
      self._set_sources[eval_set.name] = resolved.input_path
      ds = self._build_split(resolved, input_context,
                             prefix=f'{eval_set.name}/')
      ds = ds.map(functools.partial(_tag_batch, index=i))
      combined = ds if combined is None else combined.concatenate(ds)
    return combined

  def _build_split(self, resolved: configs.DataConfig, input_context,
                   prefix: str) -> tf.data.Dataset:
    """`dataloader.build_dataset` of one split (stitched: with its sessions)."""
    sessions = None
    evaluation = self.task_config.evaluation
    if not resolved.is_training and configs.stitching(evaluation):
      sessions = self._session_names[prefix] = dataloader.session_names(
          resolved.input_path)
    return dataloader.build_dataset(
        resolved, self.task_config.readouts,
        self.task_config.task_vocabulary, input_context=input_context,
        bad_records=bad_records.log_for_split(self, resolved.is_training),
        session_names=sessions, units=self.unit_vocabulary(),
        unweighted_metrics=(not resolved.is_training and
                            evaluation.protocol == 'torch_brain'))

  # -- routing targets like predictions --------------------------------------
  def route(self, model: model_lib.ReadoutModel, inputs: Mapping[str, Any],
            outputs: Mapping[str, Any]) -> Routed:
    """(predictions, targets, weights), each {task: rows of that task}.

    With static shapes every row is kept and the weights are zeroed outside
    the task's mask.
    """
    width = inputs['output_targets'].shape[-1]
    targets = tf.reshape(inputs['output_targets'], [-1, width])
    if model.static_shapes:
      predictions = {name: tf.reshape(out, [-1, out.shape[-1]])
                     for name, (out, _) in outputs.items()}
    else:
      predictions = dict(outputs)
    return (predictions,
            self._route_like_targets(model, inputs, outputs, targets),
            self._route_weights(model, inputs, outputs, 'output_weights'))

  def _route_like_targets(self, model, inputs, tasks, values: tf.Tensor
                          ) -> Dict[str, tf.Tensor]:
    """{task: the rows of `values` [queries, ...] of the task's predictions}."""
    if model.static_shapes:
      return {name: values for name in tasks}
    index = tf.reshape(inputs['output_readout_index'], [-1])
    return model.readout.route(values, index)

  def _route_weights(self, model, inputs, outputs, key: str
                     ) -> Dict[str, tf.Tensor]:
    """The per-query weights `inputs[key]` routed; with static shapes every
    row, zeroed outside the task's mask."""
    weights = tf.reshape(tf.cast(inputs[key], tf.float32), [-1])
    routed = self._route_like_targets(model, inputs, outputs, weights)
    if model.static_shapes:
      routed = {name: routed[name] * tf.cast(tf.reshape(mask, [-1]),
                                             tf.float32)
                for name, (_, mask) in outputs.items()}
    return routed

  def _per_query(self, inputs, values: tf.Tensor) -> tf.Tensor:
    """Per-sample values [B] repeated for each query: [queries], flattened
    row-major like `output_readout_index`."""
    if 'output_batch_index' in inputs:
      return tf.gather(values, inputs['output_batch_index'])
    index = inputs['output_readout_index']
    return tf.reshape(tf.broadcast_to(values[:, tf.newaxis], tf.shape(index)),
                      [-1])

  def global_losses(self, inputs, routed: Routed,
                    samples: Optional[tf.Tensor] = None
                    ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
    """(this replica's share, the global batch's) losses of a routed batch.

    samples: bool [B], the samples 'sample_share' counts; None: every real
    trial of the batch.
    """
    sums = readout_losses.loss_sums(self._specs, *routed)
    return readout_losses.global_task_losses(
        self._specs, sums, self._sample_counts(inputs, samples))

  def _sample_counts(self, inputs, samples: Optional[tf.Tensor] = None
                     ) -> Optional[readout_losses.Counts]:
    """This batch's `losses.sample_counts` ('sample_share') over `samples`
    (bool [B]; None: its real trials), else None."""
    if self.task_config.loss_weighting != 'sample_share':
      return None
    if samples is None:
      samples = eval_padding.example_mask(
          inputs, tf.shape(inputs['input_values'])[0])
    return readout_losses.sample_counts(
        self._specs, self._task_index, inputs['output_readout_index'],
        tf.cast(inputs['output_weights'], tf.float32),
        inputs.get('output_batch_index'), samples)

  # -- losses and metrics ----------------------------------------------------
  def build_losses(self, labels: Mapping[str, Any],
                   model_outputs: Mapping[str, Any],
                   aux_losses: Optional[List[tf.Tensor]] = None,
                   model: Optional[model_lib.ReadoutModel] = None
                   ) -> tf.Tensor:
    """Total loss of one (local) batch: sum_t loss_weight_t * loss_t.

    Args:
      labels: the batch dict (targets, weights, routing ids).
      model_outputs: the model's outputs for it.
      aux_losses: regularization losses, added.
      model: the model (routing); None: dynamic routing from the specs.
    """
    if model is None:
      model = _RoutingOnly(self.task_config, model_outputs)
    routed = self.route(model, labels, model_outputs)
    total = readout_losses.task_losses(
        self._specs, readout_losses.loss_sums(self._specs, *routed),
        counts=self._sample_counts(labels))['total_loss']
    if aux_losses:
      total += tf.add_n([tf.cast(l, tf.float32) for l in aux_losses])
    return total

  def compute_losses(self, inputs, model, training: bool):
    """Forward pass and losses of one replica's batch.

    Returns:
      (this replica's share of the global-batch losses, the global-batch
      losses, the routed (predictions, targets, weights)).
    """
    return self._forward_losses(inputs, model, training)[:3]

  def _forward_losses(self, inputs, model, training: bool):
    """`compute_losses` and the model's outputs (4th)."""
    outputs = model(inputs, training=training)
    routed = self.route(model, inputs, outputs)
    share, global_losses = self._losses(model, inputs, routed)
    return share, global_losses, routed, outputs

  def _losses(self, model, inputs, routed: Routed,
              samples: Optional[tf.Tensor] = None):
    """(share, global losses) of routed rows (`global_losses`), the model's
    regularization included; `samples` as in `global_losses`."""
    share, global_losses = self.global_losses(inputs, routed, samples)
    if model.losses:
      reg = tf.add_n([tf.cast(l, tf.float32) for l in model.losses])
      replicas = tf.distribute.get_strategy().num_replicas_in_sync
      share = dict(share, total_loss=share['total_loss'] + reg / replicas)
      global_losses = dict(global_losses,
                           total_loss=global_losses['total_loss'] + reg)
    return share, global_losses

  def route_eval_sets(self, model: model_lib.ReadoutModel,
                      inputs: Mapping[str, Any]) -> Dict[str, tf.Tensor]:
    """{task: int32 [n_t]}: the evaluation set of each routed row (the rows
    of `route`, in its order), from the batch's `SET_KEY` [B]."""
    trial_sets = tf.reshape(tf.cast(inputs[SET_KEY], tf.int32), [-1])
    return self._route_like_targets(model, inputs, self._specs,
                                    self._per_query(inputs, trial_sets))

  def build_metrics(self, training: bool = True):
    """Mean total and per-task losses (per evaluation set); eval: host."""
    if not training and self._eval_sets:
      metrics = []
      for i, eval_set in enumerate(self._eval_sets):
        prefix = f'{eval_set.name}/'
        metrics.append(tf_keras.metrics.Mean(f'{prefix}total_loss',
                                             dtype=tf.float32))
        metrics += [tf_keras.metrics.Mean(f'{prefix}{_loss_metric_name(n)}',
                                          dtype=tf.float32)
                    for n in self._specs]
        metrics.append(eval_padding.EvaluatedExamples(
            functools.partial(self.eval_set_dataset, i),
            name=f'{prefix}num_examples'))
      skipping = [s.data for s in self._eval_sets if s.data.skip_bad_records]
      metrics += bad_records.task_metrics(  # All sets' `bad_records_skipped`.
          self, skipping[0] if skipping else None, training)
      self._eval_metrics = self._new_eval_state()
      return metrics
    metrics = [tf_keras.metrics.Mean('total_loss', dtype=tf.float32)]
    metrics += [tf_keras.metrics.Mean(_loss_metric_name(n), dtype=tf.float32)
                for n in self._specs]
    metrics += bad_records.task_metrics(  # `bad_records_skipped`.
        self, self.task_config.train_data if training else
        self.task_config.validation_data, training)
    if not training:
      # `num_examples`: trials evaluated; zero at the end of an evaluation is
      # an error naming the dataset.
      metrics.append(eval_padding.EvaluatedExamples(self.validation_dataset))
      self._eval_metrics = self._new_eval_state()
    return metrics

  def _new_eval_state(self) -> Dict[str, readout_metrics.ReadoutMetrics]:
    """{metric prefix: accumulator}: '' without sets, else `<set>/`; each
    stitching when `configs.stitching`, under `task.evaluation.protocol`."""
    evaluation = self.task_config.evaluation
    resolution = (evaluation.stitch_resolution
                  if configs.stitching(evaluation) else None)
    return {p: readout_metrics.ReadoutMetrics(
        self._specs, stitch_resolution=resolution,
        protocol=evaluation.protocol) for p in self._prefixes()}

  def _prefixes(self) -> List[str]:
    """The metric prefixes of the accumulators, in set order."""
    return ([f'{s.name}/' for s in self._eval_sets] if self._eval_sets
            else [''])

  def process_metrics(self, metrics, labels=None, outputs=None,
                      model_losses=None, **kwargs):
    """Updates the loss means with `model_losses` ({task, 'total_loss'})."""
    logs = {}
    model_losses = model_losses or {}
    for m in metrics or []:
      key = 'total_loss' if m.name == 'total_loss' else m.name[:-len('_loss')]
      if key in model_losses:
        m.update_state(model_losses[key])
        logs[m.name] = m.result()
    return logs

  # -- steps -----------------------------------------------------------------
  def train_step(self, inputs, model, optimizer, metrics=None):
    """Forward, global-batch losses, (scaled) gradients, clipping, update."""
    with tf.GradientTape() as tape:
      share, global_losses, _ = self.compute_losses(inputs, model,
                                                    training=True)
      scaled = gradients.scale_loss(optimizer, share['total_loss'])
    variables = model.trainable_variables
    grads = gradients.unscale_gradients(optimizer,
                                        tape.gradient(scaled, variables))
    grads = self.freeze_gradients(model, grads, variables,
                                  optimizer.iterations)
    gradients.apply_gradients(optimizer, grads, variables,
                              self.task_config.gradient_clip_norm)
    logs = {self.loss: global_losses['total_loss']}
    logs.update(self.process_metrics(metrics, model_losses=global_losses))
    return logs

  def inference_step(self, inputs, model):
    return model(inputs, training=False)

  def validation_step(self, inputs, model, metrics=None):
    """Losses, and the routed rows (numbers only) for the host metrics."""
    _, global_losses, routed, outputs = self._forward_losses(
        inputs, model, training=False)
    p, t, loss_weights = routed
    w = self._route_weights(model, inputs, outputs, 'output_metric_weights')
    logs = {self.loss: global_losses['total_loss']}
    logs.update(self.process_metrics(metrics, model_losses=global_losses))
    trials = eval_padding.example_mask(
        inputs, tf.shape(inputs['input_values'])[0])
    rows = {name: {'predictions': configs.denormalize_predictions(
                       spec, tf.cast(p[name], tf.float32)),
                   'targets': t[name], 'weights': w[name]}
            for name, spec in self._specs.items()}
    if configs.stitching(self.task_config.evaluation):
      batch_size = tf.shape(inputs['input_values'])[0]
      per_query = {
          'sessions': self._per_query(inputs, inputs['session_index']),
          'starts': self._per_query(inputs, inputs['window_start']),
          'records': self._per_query(inputs, tf.range(batch_size)),
          'timestamps': tf.reshape(inputs['output_timestamps'], [-1]),
      }
      for key, values in per_query.items():
        for name, routed_values in self._route_like_targets(
            model, inputs, outputs, values).items():
          rows[name][key] = routed_values
    if not self._eval_sets:
      for m in metrics or []:
        if isinstance(m, eval_padding.EvaluatedExamples):
          m.update_state(trials)
    else:
      if SET_KEY not in inputs:
        raise ValueError(
            f'An evaluation batch without `{SET_KEY}` while task.evaluation.'
            f'eval_sets selects {list(self.eval_set_names)}: evaluate the '
            'batches of build_inputs(task.validation_data), which tag each '
            "trial's set.")
      row_sets = self.route_eval_sets(model, inputs)
      trial_sets = tf.reshape(tf.cast(inputs[SET_KEY], tf.int32), [-1])
      by_name = {m.name: m for m in metrics or []}
      replicas = tf.distribute.get_strategy().num_replicas_in_sync
      for i, prefix in enumerate(self._prefixes()):
        in_set = tf.logical_and(trials, tf.equal(trial_sets, i))
        set_trials = tf.reduce_sum(tf.cast(in_set, tf.int32))
        if replicas > 1:
          set_trials = tf.distribute.get_replica_context().all_reduce(
              tf.distribute.ReduceOp.SUM, set_trials)
        # The set's rows keep their loss weights, the others weigh 0; its
        # samples alone count for 'sample_share'.
        _, set_losses = self._losses(model, inputs, (p, t, {
            name: loss_weights[name] * tf.cast(
                tf.equal(row_sets[name], i), tf.float32)
            for name in self._specs}), samples=in_set)
        step_weight = tf.cast(set_trials > 0, tf.float32)
        for key, value in set_losses.items():
          name = prefix + ('total_loss' if key == 'total_loss' else
                           _loss_metric_name(key))
          if name in by_name:
            by_name[name].update_state(value, sample_weight=step_weight)
        if f'{prefix}num_examples' in by_name:
          by_name[f'{prefix}num_examples'].update_state(in_set)
      for name in self._specs:
        rows[name]['sets'] = row_sets[name]
      logs[_TRIAL_SETS_KEY] = host_gather.gather_for_host(trial_sets)
    # With several workers, every worker accumulates all replicas' rows.
    logs[_EVAL_KEY] = host_gather.gather_for_host(rows)
    logs[_TRIALS_KEY] = host_gather.gather_for_host(tf.cast(trials, tf.int32))
    return logs

  def aggregate_logs(self, state=None, step_outputs=None):
    """Accumulates the local replicas' rows into each set's `ReadoutMetrics`."""
    if state is None:
      if self._eval_metrics is None:
        self._eval_metrics = self._new_eval_state()
      for prefix, accumulator in self._eval_metrics.items():
        accumulator.reset()
        accumulator.set_session_names(self._session_names.get(prefix, ()))
      state = self._eval_metrics
      self._record_offset = 0
    # [(prefix, set index)]; without sets one accumulator takes every row.
    destinations = (list(zip(self._prefixes(), range(len(self._eval_sets))))
                    if self._eval_sets else [('', None)])
    parts = {name: {k: host_gather.host_parts(v) for k, v in rows.items()}
             for name, rows in step_outputs[_EVAL_KEY].items()}
    num_parts = len(next(iter(parts.values()))['predictions'])
    for j in range(num_parts):  # One part per replica.
      last_record = -1
      for name, task_parts in parts.items():
        columns = {k: task_parts[k][j] for k in ('predictions', 'targets',
                                                 'weights')}
        if 'sessions' in task_parts:
          records = task_parts['records'][j]
          # A record without a session_id is its own session: key -1 - its
          # number in the evaluation.
          columns['sessions'] = np.where(
              task_parts['sessions'][j] >= 0, task_parts['sessions'][j],
              -1 - (self._record_offset + records))
          columns['times'] = (task_parts['starts'][j].astype(np.float64) +
                              task_parts['timestamps'][j].astype(np.float64))
          last_record = max(last_record, int(np.max(records, initial=-1)))
        for prefix, i in destinations:
          if i is None:
            state[prefix].accumulate(name, **columns)
            continue
          keep = task_parts['sets'][j] == i
          if np.any(keep):
            state[prefix].accumulate(
                name, **{k: v[keep] for k, v in columns.items()})
      self._record_offset += last_record + 1
    if _TRIALS_KEY in step_outputs:
      trial_parts = host_gather.host_parts(step_outputs[_TRIALS_KEY])
      set_parts = (host_gather.host_parts(step_outputs[_TRIAL_SETS_KEY])
                   if self._eval_sets else [None] * len(trial_parts))
      for trials, sets in zip(trial_parts, set_parts):
        for prefix, i in destinations:
          state[prefix].add_examples(int(np.sum(
              trials if i is None else trials[sets == i])))
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """The host metrics of every evaluated query, per set.

    Raises:
      EmptyEvaluationError: an evaluation (set) saw no trial, or no query
        of positive weight.
    """
    if aggregated_logs is None:
      dataset, settings = (self.eval_set_dataset(0) if self._eval_sets else
                           self.validation_dataset())
      eval_padding.check_examples_seen(0, dataset, settings)
    describe = ({f'{s.name}/': functools.partial(self.eval_set_dataset, i)
                 for i, s in enumerate(self._eval_sets)} if self._eval_sets
                else {'': self.validation_dataset})
    step = ('' if global_step is None else
            f' at step {int(tf.convert_to_tensor(global_step).numpy())}')
    results = {}
    for prefix, accumulator in aggregated_logs.items():
      dataset, settings = describe[prefix]()
      values = self._reduce_one(accumulator, dataset, settings,
                                prefix.rstrip('/'), step)
      results.update({prefix + k: v for k, v in values.items()})
    return results

  def _reduce_one(self, accumulator: readout_metrics.ReadoutMetrics,
                  dataset: str, settings: Mapping[str, Any], set_name: str,
                  step: str) -> Dict[str, float]:
    """One accumulator's metrics (unprefixed); logs and prints its table."""
    eval_padding.check_examples_seen(accumulator.num_examples, dataset,
                                     settings)
    counts = {n: accumulator.num_queries(n) for n in self._specs}
    if not any(counts.values()):
      raise eval_padding.EmptyEvaluationError(
          f'Evaluation saw {accumulator.num_examples} trials of {dataset} '
          'but no query of positive weight in any of the tasks '
          f'{sorted(self._specs)}: no readout metric has a value.')
    try:
      results = accumulator.result()
    except ValueError as e:
      raise ValueError(f'Readout evaluation of {dataset}: {e}') from e
    for key, reason in accumulator.unmeasured().items():
      logging.warning('Readout evaluation of %s: no value for %s (%s).',
                      dataset, key, reason)
    table = readout_metrics.format_table(
        results, self._specs, counts,
        protocol=self.task_config.evaluation.protocol)
    title = f'Readout evaluation{step} ({accumulator.num_examples} trials'
    title += f', set {set_name})' if set_name else ')'
    logging.info('%s:\n%s', title, table)
    if self.task_config.evaluation.print_table:
      print(f'{title} ({self.name or "readout"}):\n{table}', flush=True)
    accumulator.reset()
    return results


def _tag_batch(batch: Dict[str, tf.Tensor], index: int
               ) -> Dict[str, tf.Tensor]:
  """`batch` with `SET_KEY`: int32 [B] filled with `index`."""
  batch = dict(batch)
  batch[SET_KEY] = tf.fill(tf.shape(batch['input_values'])[:1],
                           tf.constant(index, tf.int32))
  return batch


class _RoutingOnly:
  """Stands in for a model in `build_losses` when only routing is needed."""

  def __init__(self, task_config: configs.ReadoutTaskConfig, outputs):
    first = next(iter(outputs.values()))
    self.static_shapes = isinstance(first, tuple)
    self.readout = multitask_readout.MultitaskReadout(
        task_config.readouts, configs.task_index(task_config.task_vocabulary))
