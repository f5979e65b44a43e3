"""Connectivity search: checkpoint edge weights -> a derived structure.

`official_ext.assemblenet.derive_structure` and the backbone config's
`model_structure_path` / `model_edge_weights_path`.
"""
import json
import os
import re
import shlex

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext import train
from official_ext.assemblenet import configs
from official_ext.assemblenet import derive_structure as ds
from official_ext.assemblenet import structures
from official_ext.assemblenet.modeling import assemblenet_plus_lite as anet
from official_ext.core import experiment_params
from tests import cli
from tests.assemblenet import minimal

SEARCH = structures.TINY_SEARCH_STRUCTURE
KEY = 'task.model.backbone.assemblenet_plus_lite'

# Post-sigmoid weight of each input of TINY_SEARCH_STRUCTURE's block nodes.
WEIGHTS = {
    2: [0.9, 0.2],                        # inputs [0, 1]: keeps 0
    3: [0.3, 0.8],                        # inputs [0, 1]: keeps 1
    4: [0.1, 0.6, 0.7, 0.05],             # inputs [0..3]: keeps 1, 2
    5: [0.2, 0.3, 0.1, 0.4, 0.45],        # none >= 0.5: its strongest, 4
    6: [0.1, 0.1, 0.1, 0.3, 0.2, 0.8],    # keeps 5; node 3 then feeds
}                                         # nothing: its strongest, 3 -> 5
EXPECTED = [
    [-1, 1], [-2, 1],
    [0, [0], [8, 8, 8], 1, 2],
    [0, [1], [8, 8, 4], 2, 2],
    [1, [1, 2], [16, 16, 8], 1, 2],
    [2, [3, 4], [24, 24, 12], 2, 2],
    [3, [5], [32, 32, 16], 1, 1],
]
EXPECTED_WEIGHTS = [[], [], [], [], [[0.6, 0.7]], [[0.4, 0.45]], []]


def _backbone(structure, edge_weights=None):
  return anet.AssembleNetPlusLite(
      structure, edge_weights, structures.TINY_BLOCKS_PER_LEVEL,
      tf_keras.layers.InputSpec(shape=[None, 4, 16, 16, 3]), stem_filters=4,
      attention_mode=None, rep_flow_options={'num_iter': 1})


@pytest.fixture(scope='module')
def search_checkpoint(tmp_path_factory):
  """A search model (edge weights set to WEIGHTS) saved as training saves it:

  model, its checkpoint items and an optimizer with slots for every
  variable (the agg_weights' Adam slots must not be taken for them)."""
  model = anet.AssembleNetPlusLiteModel(_backbone(SEARCH), 8,
                                        head_filters=(4, 4))
  for i, w in WEIGHTS.items():
    model.backbone.get_layer(f'node_{i}_fusion').agg_weights.assign(
        -np.log(1.0 / np.asarray(w) - 1.0))
  optimizer = tf_keras.optimizers.Adam()
  optimizer.build(model.trainable_variables)
  ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer,
                             **model.checkpoint_items)
  return ckpt.write(str(tmp_path_factory.mktemp('search') / 'ckpt-1'))


def test_checkpoint_variables_map_to_nodes(search_checkpoint):
  logits = ds.edge_weight_logits(search_checkpoint)
  assert sorted(logits) == sorted(WEIGHTS)
  learned = ds.learned_edge_weights(SEARCH, logits)
  assert learned[:2] == [None, None]
  for i, w in WEIGHTS.items():
    np.testing.assert_allclose(learned[i], w, atol=1e-6)
  with pytest.raises(ValueError, match='node 5 has 4 inputs'):
    ds.learned_edge_weights(structures.TINY_STRUCTURE, logits,
                            where='ckpt-1')


def test_derive_writes_the_expected_structure_and_png(search_checkpoint,
                                                      tmp_path):
  params = experiment_params.load_params('assemblenet_plus_lite_search_demo')
  out = tmp_path / 'structure.json'
  png = tmp_path / 'graph.png'
  derived = ds.derive(params, search_checkpoint, 0.5, str(out), png=str(png))
  assert json.loads(out.read_text()) == EXPECTED
  weights = json.loads((tmp_path / 'structure_edge_weights.json').read_text())
  assert len(weights) == len(EXPECTED)
  for got, want in zip(weights, EXPECTED_WEIGHTS):
    np.testing.assert_allclose(np.asarray(got, float).ravel(),
                               np.asarray(want, float).ravel(), atol=1e-6)
  structures.validate_structure(json.loads(out.read_text()), weights,
                                structures.TINY_BLOCKS_PER_LEVEL)
  status = {(j, i): s for j, i, _, s in derived.edges}
  assert status[(4, 5)] == ds.KEPT_STRONGEST_INPUT
  assert status[(3, 5)] == ds.KEPT_TO_OUTPUT
  assert status[(1, 4)] == ds.KEPT and status[(0, 4)] == ds.DROPPED
  assert (derived.num_kept, len(derived.edges)) == (7, 19)
  data = png.read_bytes()
  assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 10_000
  # The drawing saw every searched edge, kept and dropped as derived.
  assert ds.draw_graph(SEARCH, derived.edges, str(tmp_path / 'g2.png')) == (
      7, 12)


def test_threshold_edge_cases():
  rng = np.random.default_rng(0)
  weights = [None if structures.is_stem(n) else
             list(rng.uniform(0.05, 0.6, len(n[1]))) for n in SEARCH]
  # No edge reaches the threshold: each block node keeps its strongest input
  # (and a node then feeding nothing its strongest edge on to the output).
  derived = ds.prune(SEARCH, weights, 0.99)
  for i, node in enumerate(SEARCH):
    if not structures.is_stem(node):
      strongest = node[1][int(np.argmax(weights[i]))]
      assert strongest in derived.structure[i][1]
  reached = {len(SEARCH) - 1}
  for i in range(len(SEARCH) - 1, -1, -1):
    if i in reached and not structures.is_stem(derived.structure[i]):
      reached.update(derived.structure[i][1])
  assert reached == set(range(len(SEARCH)))  # every node feeds the output
  # Threshold 0 keeps the whole search space.
  assert ds.prune(SEARCH, weights, 0.0).structure == SEARCH
  with pytest.raises(ValueError, match='threshold'):
    ds.prune(SEARCH, weights, 1.5)
  # A node after the output is dropped; one that feeds nothing is an error.
  after = SEARCH + [[1, [0, 1], [8, 8, 8], 1, 1]]
  derived = ds.prune(after, weights + [[0.9, 0.9]], 0.5)
  assert derived.dropped_nodes == [7] and len(derived.structure) == 7
  with pytest.raises(ValueError, match='node 3 feeds no node'):
    ds.prune([[-1, 1], [0, [0], [4, 4, 4], 1, 1], [0, [0], [4, 4, 4], 1, 1],
              [0, [0], [4, 4, 4], 1, 1], [3, [1, 2], [4, 4, 4], 1, 1]],
             [None, [1.0], [1.0], [1.0], [0.5, 0.5]], 0.5)


def test_demo_trains_on_files_via_params_override(tmp_path):
  (tmp_path / 's.json').write_text(json.dumps(EXPECTED))
  (tmp_path / 'w.json').write_text(json.dumps(EXPECTED_WEIGHTS))
  override = (f"{KEY}.model_structure='',"
              f'{KEY}.model_structure_path={tmp_path / "s.json"},'
              f'{KEY}.model_edge_weights_path={tmp_path / "w.json"}')
  params = experiment_params.load_params('assemblenet_plus_lite_demo',
                                         params_override=override)
  c = params.task.model.backbone.get()
  assert c.model_structure == ''
  backbone = anet.build_backbone_from_config(
      tf_keras.layers.InputSpec(shape=[None, 4, 16, 16, 3]),
      c.replace(attention_mode=None, stem_filters=4))
  assert backbone.structure == EXPECTED
  fusion = backbone.get_layer('node_5_fusion')
  assert not fusion.trainable_weights or all(
      'agg_weights' not in v.name for v in fusion.trainable_weights)
  np.testing.assert_allclose(tf.sigmoid(fusion.agg_weights), [0.4, 0.45],
                             atol=1e-6)

  demo = configs.assemblenet_plus_lite_demo().task.model.backbone.get()
  with pytest.raises(ValueError, match='model_structure_path are both set'):
    structures.from_config_fields(demo.model_structure,
                                  str(tmp_path / 's.json'), '', '')
  with pytest.raises(ValueError, match='model_edge_weights_path are both'):
    structures.from_config_fields('', str(tmp_path / 's.json'), '[[]]',
                                  str(tmp_path / 'w.json'))
  missing = str(tmp_path / 'missing.json')
  with pytest.raises(ValueError, match=r'model_structure_path=.*missing\.json'):
    structures.from_config_fields('', missing, '', '')
  (tmp_path / 'bad.json').write_text('[[-1, 1],')
  with pytest.raises(ValueError,
                     match=r'model_edge_weights_path=.*bad\.json.*not valid'):
    structures.from_config_fields('', str(tmp_path / 's.json'), '',
                                  str(tmp_path / 'bad.json'))


def test_checkpoint_flags_name_themselves(tmp_path, search_checkpoint):
  assert ds.resolve_checkpoint(checkpoint=search_checkpoint) == (
      search_checkpoint)
  with pytest.raises(ValueError, match='exactly one of --model_dir'):
    ds.resolve_checkpoint(str(tmp_path), search_checkpoint)
  with pytest.raises(ValueError, match=r'--model_dir=.* without a checkpoint'):
    ds.resolve_checkpoint(model_dir=str(tmp_path))
  with pytest.raises(ValueError, match=r'--checkpoint=.*no checkpoint'):
    ds.resolve_checkpoint(checkpoint=str(tmp_path / 'ckpt-9'))


def test_no_output_inside_the_model_dir(search_checkpoint, tmp_path):
  """--output, its edge weights or --png inside the searched checkpoint's
  folder (a model_dir) is refused before the checkpoint is read; nothing is
  written there."""
  params = experiment_params.load_params('assemblenet_plus_lite_search_demo')
  model_dir = os.path.dirname(search_checkpoint)
  before = sorted(os.listdir(model_dir))
  for output, kwargs, flag in (
      (os.path.join(model_dir, 'structure.json'), {}, '--output'),
      (str(tmp_path / 's.json'),
       dict(edge_weights_output=os.path.join(model_dir, 'new', 'w.json')),
       '--edge_weights_output'),
      (str(tmp_path / 's.json'), dict(png=os.path.join(model_dir, 'g.png')),
       '--png')):
    with pytest.raises(ValueError, match=f'{flag}={model_dir}/.* lies inside '
                       f'the model_dir {model_dir} '):
      ds.derive(params, search_checkpoint, 0.5, output, **kwargs)
  assert sorted(os.listdir(model_dir)) == before
  assert not os.listdir(tmp_path)


def _printed_override(capsys) -> str:
  """The --params_override of the 'Train on it: ' line derive_structure
  printed, as a POSIX shell passes it."""
  (line,) = [l for l in capsys.readouterr().out.splitlines()
             if l.startswith('Train on it: ')]
  (word,) = shlex.split(line[len('Train on it: '):])
  return word[len('--params_override='):]


def test_task_builds_the_structure_the_printed_override_names(
    search_checkpoint, tmp_path, capsys):
  """derive_structure's command prints the override for step 3; that line,
  pasted into a POSIX shell, gives the task (its clip-size checks and its
  model) the derived structure from its file."""
  out = tmp_path / 'derived' / 'structure.json'
  cli.run_main(ds, f'--checkpoint={search_checkpoint}',
               '--experiment=assemblenet_plus_lite_search_demo',
               '--threshold=0.5', f'--output={out}')
  params = experiment_params.load_params(
      'assemblenet_plus_lite_demo', params_override=_printed_override(capsys),
      lock=False)
  assert params.task.model.backbone.get().model_structure == ''
  task = task_factory.get_task(params.task)
  assert task.model_input_shape() == list(
      params.task.train_data.feature_shape)
  model = task.build_model()
  assert model.backbone.structure == EXPECTED
  # A structure whose flow stem cannot take a 1-frame clip, from its file:
  # the task's check reads the file too.
  params.override({'task': {'validation_data': {
      'feature_shape': [1, 32, 32, 3]}}}, is_strict=True)
  with pytest.raises(ValueError, match=r'task\.validation_data\.feature_shape'
                     r' \[1, 32, 32, 3\]: 1 frames'):
    task_factory.get_task(params.task).model_input_shape()


def test_connectivity_search_end_to_end(tmp_path, capsys):
  """The three documented steps at tiny sizes: the search demo trained,
  `derive_structure` on its model_dir, the demo trained on the derived
  structure with the override the command printed."""
  data = {'tfds_name': 'moving_shapes/tiny', 'feature_shape': [4, 32, 32, 3],
          'global_batch_size': 4}
  tiny = {
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {'model': {'backbone': {'assemblenet_plus_lite': {
          'stem_filters': 4, 'rep_flow': {'num_iter': 1}}},
                         'head_filters': [8, 8]},
               'train_data': data, 'validation_data': data,
               'demo_data': {'data_dir': str(tmp_path / 'tfds')}},
      'trainer': {'train_steps': 2, 'steps_per_loop': 2,
                  'summary_interval': 2, 'checkpoint_interval': 2}}
  search = experiment_params.load_params('assemblenet_plus_lite_search_demo',
                                         lock=False)
  search.override(tiny, is_strict=True)
  # The search space of the minimal network (a fusion of both stems): it
  # derives as the demo's 7-node search does, at a fraction of the tracing.
  search.override({'task': {'model': {'backbone': {'assemblenet_plus_lite': {
      'model_structure': json.dumps(structures.dense_search_structure(
          minimal.STRUCTURE))}}}}}, is_strict=True)
  train.run(search, 'train', str(tmp_path / 'search'))
  out = tmp_path / 'derived' / 'structure.json'
  cli.run_main(ds, f'--model_dir={tmp_path / "search"}',
               '--experiment=assemblenet_plus_lite_search_demo',
               '--threshold=0.5', f'--output={out}')
  derived = experiment_params.load_params(
      'assemblenet_plus_lite_demo', lock=False,
      params_override=_printed_override(capsys))
  derived.override(tiny, is_strict=True)
  model, _ = train.run(derived, 'train', str(tmp_path / 'derived_demo'))
  assert model.backbone.structure == json.loads(out.read_text())
  assert tf.train.latest_checkpoint(str(tmp_path / 'derived_demo'))


def test_derive_an_assemblenet_search(tmp_path):
  """An AssembleNet (one int of filters a node) search checkpoint derives
  to a structure of its own format, read through the `assemblenet` keys."""
  from official_ext.assemblenet.modeling import assemblenet as asn  # pylint: disable=g-import-not-at-top
  search = structures.dense_search_structure(structures.TINY_ASN_STRUCTURE,
                                            int_filters=True)
  backbone = asn.AssembleNet(
      search, None, structures.TINY_BLOCKS_PER_LEVEL,
      input_specs=tf_keras.layers.InputSpec(shape=[None, 2, 32, 32, 3]),
      rep_flow_options={'num_iter': 1})
  model = asn.AssembleNetModel(backbone, 8)
  for i, node in enumerate(search):
    if not structures.is_stem(node) and len(node[1]) > 1:
      backbone.get_layer(f'node_{i}_fusion').agg_weights.assign(
          np.linspace(-3.0, 3.0, len(node[1])))
  ckpt = tf.train.Checkpoint(model=model).write(
      str(tmp_path / 'search' / 'ckpt-1'))
  params = exp_factory.get_exp_config('assemblenet50_demo')
  params.override({'task': {'model': {'backbone': {'assemblenet': {
      'model_structure': json.dumps(search)}}}}})
  out = tmp_path / 'structure.json'
  derived = ds.derive(params, ckpt, 0.5, str(out))
  got = json.loads(out.read_text())
  assert got == derived.structure
  structures.validate_structure(got, derived.edge_weights,
                                structures.TINY_BLOCKS_PER_LEVEL,
                                int_filters=True)
  assert [n[2] for n in got if not structures.is_stem(n)] == [8, 16, 16, 16]
  assert ds.train_override('s.json', 'w.json', 'assemblenet').startswith(
      '--params_override="task.model.backbone.assemblenet.model_structure=')
  bad = tmp_path / 'in.json'
  bad.write_text('[]')
  params.override({'task': {'model': {'backbone': {'assemblenet': {
      'model_structure_path': str(bad)}}}}})
  with pytest.raises(ValueError, match=re.escape(
      'task.model.backbone.assemblenet.model_structure and '
      'task.model.backbone.assemblenet.model_structure_path are both set')):
    ds.derive(params, ckpt, 0.5, str(tmp_path / 'o2.json'))
