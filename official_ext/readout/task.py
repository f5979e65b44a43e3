"""The multitask readout task (`ReadoutTask`)."""
from typing import Any, Dict, List, Mapping, Optional, Tuple

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import base_task
from official.core import task_factory
from official_ext.core import bad_records
from official_ext.core import eval_padding
from official_ext.core import multiworker
from official_ext.core import gradients
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import demo_data
from official_ext.readout import losses as readout_losses
from official_ext.readout import metrics as readout_metrics
from official_ext.readout.modeling import model as model_lib
from official_ext.readout.modeling import multitask_readout

_EVAL_KEY = 'readout_eval'
# The batch's trial mask (1: a real trial, 0: padding), for the trial count.
_TRIALS_KEY = 'readout_eval_trials'

Routed = Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor],
               Dict[str, tf.Tensor]]


def _loss_metric_name(task: str) -> str:
  return f'{task}_loss'


@task_factory.register_task_cls(configs.ReadoutTaskConfig)
class ReadoutTask(base_task.Task):
  """Routed per-task heads on a shared encoder (see `configs`).

  Inputs are batch dicts of `dataloader.build_dataset` (padded or chained
  queries). Training minimizes sum_t loss_weight_t * loss_t (`losses`;
  `task.loss_weighting` 'sample_share' scales each term by the share of the
  global batch's samples holding the task), with each task's weighted mean
  taken over the global batch (exact under a distribution strategy).
  Normalised readouts (`ReadoutSpec.normalize_mean`) are trained on
  normalised targets and evaluated on de-normalised predictions. Evaluation
  reports the per-task losses,
  `<task>/<metric>` for every metric of every spec, `average/<metric>` and
  `average/score` (metrics are computed on the host over every replica's
  queries), `num_examples` (the trials evaluated), and prints the per-task
  table. Every validation trial is evaluated (a static-shape last batch is
  padded, the padding masked: `core.eval_padding`); an evaluation of zero
  trials is an `EmptyEvaluationError` naming the dataset, and a metric with
  nothing to measure is left out (logged), never NaN. Metrics weigh queries
  by their metric weights (`output_eval_mask`, else the loss weights);
  `task.evaluation.stitch` averages the predictions of overlapping windows
  and adds per-session metrics (`metrics`).
  """

  def __init__(self, params: configs.ReadoutTaskConfig, logging_dir=None,
               name=None):
    super().__init__(params, logging_dir=logging_dir, name=name)
    configs.validate_readouts(params.readouts, params.task_vocabulary)
    if params.loss_weighting not in configs.LOSS_WEIGHTINGS:
      raise ValueError(f'task.loss_weighting is {params.loss_weighting!r}; '
                       f'expected one of {configs.LOSS_WEIGHTINGS}.')
    evaluation = params.evaluation
    if evaluation.stitch and not evaluation.stitch_resolution > 0:
      raise ValueError('task.evaluation.stitch_resolution is '
                       f'{evaluation.stitch_resolution}; expected seconds '
                       '> 0.')
    self._specs = {s.name: s for s in params.readouts}
    self._task_index = configs.task_index(params.task_vocabulary)
    self._eval_metrics = None
    self._validation_source = None  # Set by build_inputs.
    # Stitched evaluation: the validation records' sessions (build_inputs)
    # and the records without one counted so far (aggregate_logs).
    self._session_names = None
    self._record_offset = 0

  @property
  def readout_specs(self) -> Dict[str, configs.ReadoutSpec]:
    return dict(self._specs)

  # -- model -----------------------------------------------------------------
  def build_model(self, encoder=None) -> model_lib.ReadoutModel:
    """The model with every head; `encoder`: a shared TokenEncoder."""
    model = model_lib.build_model(self.task_config, encoder=encoder)
    logging.info('Readout model: %d heads, %d parameters.',
                 len(self._specs),
                 sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    return model

  def build_single_task_model(self, task_name: str,
                              checkpoint_path: str) -> model_lib.ReadoutModel:
    """A one-head model grafted from a multitask checkpoint (see
    `model.graft_single_task_head`)."""
    return model_lib.graft_single_task_head(self.task_config, task_name,
                                            checkpoint_path)

  # -- data ------------------------------------------------------------------
  def _resolve_input_path(self, params: configs.DataConfig
                          ) -> configs.DataConfig:
    if params.input_path:
      return params
    key = ('task.train_data.input_path' if params.is_training else
           'task.validation_data.input_path')
    if not self.task_config.demo_data.enabled:
      raise ValueError(f'{key} is empty: point it at readout TFRecords (see '
                       'official_ext.readout.dataloader for the schema), or '
                       'set task.demo_data.enabled=true for generated data.')
    train, validation = demo_data.ensure_demo_data(self.task_config)
    pattern = train if params.is_training else validation
    logging.info('%s is empty: using generated demo data %s', key, pattern)
    return params.replace(input_path=pattern)

  def validation_dataset(self) -> Tuple[str, Dict[str, Any]]:
    """(what the validation data is, the config keys that shape it), for
    the errors of an evaluation that saw no trial."""
    return eval_padding.describe_split(
        self.task_config.validation_data,
        resolved_input_path=self._validation_source)

  def build_inputs(self, params: configs.DataConfig,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    """The batched split (`dataloader.build_dataset`); in evaluation every
    record once, a static-shape last batch padded (`eval_mask`)."""
    resolved = self._resolve_input_path(params)
    sessions = None
    if not params.is_training:
      self._validation_source = resolved.input_path
      if self.task_config.evaluation.stitch:
        sessions = self._session_names = dataloader.session_names(
            resolved.input_path)
    return dataloader.build_dataset(
        resolved, self.task_config.readouts,
        self.task_config.task_vocabulary, input_context=input_context,
        bad_records=bad_records.log_for_split(self, params.is_training),
        session_names=sessions)

  # -- routing targets like predictions --------------------------------------
  def route(self, model: model_lib.ReadoutModel, inputs: Mapping[str, Any],
            outputs: Mapping[str, Any]) -> Routed:
    """(predictions, targets, weights), each {task: rows of that task}.

    Targets [n_t, T] and weights [n_t] are routed like the predictions
    [n_t, dim]: the same rows in the same order. With static shapes every
    row is kept and the weights are zeroed outside the task's mask.
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

  def _route_like_targets(self, model, inputs, outputs, values: tf.Tensor
                          ) -> Dict[str, tf.Tensor]:
    """{task: the rows of `values` ([queries, ...], queries flattened
    row-major) of the task's predictions}."""
    if model.static_shapes:
      return {name: values for name in outputs}
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

  def global_losses(self, inputs, routed: Routed
                    ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
    """(this replica's share, the global batch's) task losses and total of a
    routed batch (`losses.global_task_losses`), weighted by
    `task.loss_weighting`."""
    sums = readout_losses.loss_sums(self._specs, *routed)
    return readout_losses.global_task_losses(self._specs, sums,
                                             self._sample_counts(inputs))

  def _sample_counts(self, inputs) -> Optional[readout_losses.Counts]:
    """This batch's `losses.sample_counts` ('sample_share'), else None."""
    if self.task_config.loss_weighting != 'sample_share':
      return None
    return readout_losses.sample_counts(
        self._specs, self._task_index, inputs['output_readout_index'],
        tf.cast(inputs['output_weights'], tf.float32),
        inputs.get('output_batch_index'),
        eval_padding.example_mask(inputs,
                                  tf.shape(inputs['input_values'])[0]))

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
      model: the model (needed for routing; the dynamic routing is rebuilt
        from the specs when None).

    Returns:
      float32 scalar.
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
      (share, global_losses, routed): `share` {task, 'total_loss'} is this
      replica's part of the global-batch losses (the replicas' shares add up
      to them); `global_losses` the global-batch losses; `routed` the
      (predictions, targets, weights) of `route`.
    """
    return self._forward_losses(inputs, model, training)[:3]

  def _forward_losses(self, inputs, model, training: bool):
    """`compute_losses` and the model's outputs (4th)."""
    outputs = model(inputs, training=training)
    routed = self.route(model, inputs, outputs)
    share, global_losses = self.global_losses(inputs, routed)
    if model.losses:
      reg = tf.add_n([tf.cast(l, tf.float32) for l in model.losses])
      replicas = tf.distribute.get_strategy().num_replicas_in_sync
      share = dict(share, total_loss=share['total_loss'] + reg / replicas)
      global_losses = dict(global_losses,
                           total_loss=global_losses['total_loss'] + reg)
    return share, global_losses, routed, outputs

  def build_metrics(self, training: bool = True):
    """Mean of the total and of each task's loss; eval: host accumulator."""
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
      self._eval_metrics = self._new_eval_metrics()
    return metrics

  def _new_eval_metrics(self) -> readout_metrics.ReadoutMetrics:
    evaluation = self.task_config.evaluation
    return readout_metrics.ReadoutMetrics(
        self._specs, stitch_resolution=(evaluation.stitch_resolution
                                        if evaluation.stitch else None))

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
    """Forward, global-batch losses, (scaled) gradients, clipping, update.

    Returns:
      logs: {'loss': global total loss, and the loss metrics}.
    """
    with tf.GradientTape() as tape:
      share, global_losses, _ = self.compute_losses(inputs, model,
                                                    training=True)
      scaled = gradients.scale_loss(optimizer, share['total_loss'])
    gradients.minimize(optimizer, tape, scaled, model.trainable_variables,
                       self.task_config.gradient_clip_norm)
    logs = {self.loss: global_losses['total_loss']}
    logs.update(self.process_metrics(metrics, model_losses=global_losses))
    return logs

  def inference_step(self, inputs, model):
    return model(inputs, training=False)

  def validation_step(self, inputs, model, metrics=None):
    """Losses and the routed rows for the host metrics (aggregate_logs).

    Padding trials (`eval_mask` False) have query weight 0 (dataloader): they
    count in no loss and no metric, nor in `num_examples`. The host gets, per
    task, the predictions (de-normalised), targets and metric weights, and
    when stitching each query's session key, window start, timestamp and
    row in the batch (numbers only: no string enters the step).
    """
    _, global_losses, (p, t, _), outputs = self._forward_losses(
        inputs, model, training=False)
    w = self._route_weights(model, inputs, outputs, 'output_metric_weights')
    logs = {self.loss: global_losses['total_loss']}
    logs.update(self.process_metrics(metrics, model_losses=global_losses))
    trials = eval_padding.example_mask(
        inputs, tf.shape(inputs['input_values'])[0])
    for m in metrics or []:
      if isinstance(m, eval_padding.EvaluatedExamples):
        m.update_state(trials)
    # With several workers, every worker accumulates all replicas' rows.
    rows = {name: {'predictions': configs.denormalize_predictions(
                       spec, tf.cast(p[name], tf.float32)),
                   'targets': t[name], 'weights': w[name]}
            for name, spec in self._specs.items()}
    if self.task_config.evaluation.stitch:
      batch_size = tf.shape(inputs['input_values'])[0]
      per_query = {
          'sessions': self._per_query(inputs, inputs['session_index']),
          'starts': self._per_query(inputs, inputs['window_start']),
          'records': self._per_query(inputs, tf.range(batch_size)),
          'timestamps': tf.reshape(inputs['output_timestamps'], [-1]),
      }
      for key, values in per_query.items():
        for name, routed in self._route_like_targets(
            model, inputs, outputs, values).items():
          rows[name][key] = routed
    # With several workers, every worker accumulates all replicas' rows.
    logs[_EVAL_KEY] = multiworker.gather_for_host(rows)
    logs[_TRIALS_KEY] = multiworker.gather_for_host(tf.cast(trials, tf.int32))
    return logs

  def aggregate_logs(self, state=None, step_outputs=None):
    """Accumulates every local replica's rows into the metric accumulator."""
    if state is None:
      if self._eval_metrics is None:
        self._eval_metrics = self._new_eval_metrics()
      self._eval_metrics.reset()
      state = self._eval_metrics
      state.set_session_names(self._session_names or ())
      self._record_offset = 0
    parts = {name: {k: multiworker.host_parts(v) for k, v in rows.items()}
             for name, rows in step_outputs[_EVAL_KEY].items()}
    num_parts = len(next(iter(parts.values()))['predictions'])
    for i in range(num_parts):  # One part per replica.
      last_record = -1
      for name, task_parts in parts.items():
        p, t, w = (task_parts[k][i] for k in ('predictions', 'targets',
                                               'weights'))
        if 'sessions' not in task_parts:
          state.accumulate(name, p, t, w)
          continue
        sessions, records = task_parts['sessions'][i], task_parts['records'][i]
        # A record without a session_id is its own session: key -1 - its
        # number in the evaluation.
        sessions = np.where(sessions >= 0, sessions,
                            -1 - (self._record_offset + records))
        times = (task_parts['starts'][i].astype(np.float64) +
                 task_parts['timestamps'][i].astype(np.float64))
        state.accumulate(name, p, t, w, sessions=sessions, times=times)
        last_record = max(last_record, int(np.max(records, initial=-1)))
      self._record_offset += last_record + 1
    if _TRIALS_KEY in step_outputs:
      for trials in multiworker.host_parts(step_outputs[_TRIALS_KEY]):
        state.add_examples(int(np.sum(trials)))
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """The host metrics over every evaluated query.

    Raises:
      EmptyEvaluationError: the evaluation saw no trial, or no query of
        positive weight (message: the dataset and its config keys).
    """
    dataset, settings = self.validation_dataset()
    if aggregated_logs is None:
      eval_padding.check_examples_seen(0, dataset, settings)
    eval_padding.check_examples_seen(aggregated_logs.num_examples, dataset,
                                     settings)
    counts = {n: aggregated_logs.num_queries(n) for n in self._specs}
    if not any(counts.values()):
      raise eval_padding.EmptyEvaluationError(
          f'Evaluation saw {aggregated_logs.num_examples} trials of {dataset} '
          'but no query of positive weight in any of the tasks '
          f'{sorted(self._specs)}: no readout metric has a value.')
    results = aggregated_logs.result()
    for key, reason in aggregated_logs.unmeasured().items():
      logging.warning('Readout evaluation of %s: no value for %s (%s).',
                      dataset, key, reason)
    table = readout_metrics.format_table(results, self._specs, counts)
    step = ('' if global_step is None else
            f' at step {int(tf.convert_to_tensor(global_step).numpy())}')
    step += f' ({aggregated_logs.num_examples} trials)'
    logging.info('Readout evaluation%s:\n%s', step, table)
    if self.task_config.evaluation.print_table:
      print(f'Readout evaluation{step} ({self.name or "readout"}):\n{table}',
            flush=True)
    aggregated_logs.reset()
    return results


class _RoutingOnly:
  """Stands in for a model in `build_losses` when only routing is needed."""

  def __init__(self, task_config: configs.ReadoutTaskConfig, outputs):
    first = next(iter(outputs.values()))
    self.static_shapes = isinstance(first, tuple)
    self.readout = multitask_readout.MultitaskReadout(
        task_config.readouts, configs.task_index(task_config.task_vocabulary))
