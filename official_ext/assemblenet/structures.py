"""AssembleNet, AssembleNet++ and AssembleNet++lite network structures: the
published ones and tiny ones, their checks and the readers of the config's
structure fields (the format: docs/assemblenet.md#the-network)."""
import json
from typing import Any, List, Optional, Sequence, Tuple, Union

STEM_RGB = -1
STEM_FLOW = -2
STEM_OBJECT = -3
STEM_TYPES = (STEM_RGB, STEM_FLOW, STEM_OBJECT)
BLOCK_LEVELS = (0, 1, 2, 3)

ASSEMBLENET_PLUS_LITE_STRUCTURE = [
    [-1, 1], [-2, 1],
    [0, [0, 1], [27, 27, 12], 1, 2, 0],
    [0, [0, 1], [27, 27, 12], 4, 2, 0],
    [1, [0, 1, 2, 3], [54, 54, 24], 2, 2, 0],
    [1, [0, 1, 2, 3], [54, 54, 24], 1, 2, 0],
    [1, [0, 1, 2, 3], [54, 54, 24], 4, 2, 0],
    [1, [0, 1, 2, 3], [54, 54, 24], 1, 2, 0],
    [2, [0, 1, 2, 3, 4, 5, 6, 7], [152, 152, 68], 1, 2, 0],
    [2, [0, 1, 2, 3, 4, 5, 6, 7], [152, 152, 68], 4, 2, 0],
    [3, [2, 3, 4, 5, 6, 7, 8, 9], [432, 432, 192], 2, 2, 0],
]

ASSEMBLENET_PLUS_LITE_EDGE_WEIGHTS = [
    [], [],
    [[0.19914183020591736, 0.9278576374053955]],
    [[0.010816320776939392, 0.888792097568512]],
    [[0.9473835825920105, 0.6303419470787048, 0.1704932451248169,
      0.05950307101011276]],
    [[0.9560931324958801, 0.7898273468017578, 0.36138781905174255,
      0.07344610244035721]],
    [[0.9213919043540955, 0.13418640196323395, 0.8371981978416443,
      0.07936054468154907]],
    [[0.9441559910774231, 0.9435100555419922, 0.7253988981246948,
      0.13498817384243011]],
    [[0.9964852333068848, 0.8427878618240356, 0.8895476460456848,
      0.11014710366725922, 0.6270533204078674, 0.44782018661499023,
      0.61344975233078, 0.44898226857185364]],
    [[0.9970942735671997, 0.7105681896209717, 0.5078442096710205,
      0.0951600968837738, 0.624282717704773, 0.8527252674102783,
      0.8105692863464355, 0.7857823967933655]],
    [[0.6180334091186523, 0.11882413923740387, 0.06102970987558365,
      0.04484326392412186, 0.05602221190929413, 0.052324872463941574,
      0.9969874024391174, 0.9987731575965881]],
]

ASSEMBLENET_PLUS_LITE_BLOCKS_PER_LEVEL = (3, 5, 11, 7)

# AssembleNet-50 / -101 (Ryoo et al., ICLR 2020; found by evolution on
# Moments in Time) and their learned edge weights, as published with the
# original code (`asn50_structure`, `asn101_structure`,
# `asn_structure_weights`). A block node's filters are one int f: its blocks
# end with 4 f channels.
ASN50_STRUCTURE = [
    [-1, 4], [-1, 4], [-2, 1], [-2, 1],
    [0, [1], 32, 1, 1, 0], [0, [0], 32, 4, 1, 0],
    [0, [0, 1, 2, 3], 32, 1, 1, 0], [0, [2, 3], 32, 2, 1, 0],
    [1, [0, 4, 5, 6, 7], 64, 2, 2, 0], [1, [0, 2, 4, 7], 64, 1, 2, 0],
    [1, [0, 5, 7], 64, 4, 2, 0], [1, [0, 5], 64, 1, 2, 0],
    [2, [4, 8, 10, 11], 256, 1, 2, 0], [2, [8, 9], 256, 4, 2, 0],
    [3, [12, 13], 512, 2, 2, 0],
]
ASN101_STRUCTURE = [
    [-1, 4], [-1, 4], [-2, 1], [-2, 1],
    [0, [1], 32, 1, 1, 0], [0, [0], 32, 4, 1, 0],
    [0, [0, 1, 2, 3], 32, 1, 1, 0], [0, [2, 3], 32, 2, 1, 0],
    [1, [0, 4, 5, 6, 7], 64, 2, 2, 0], [1, [0, 2, 4, 7], 64, 1, 2, 0],
    [1, [0, 5, 7], 64, 4, 2, 0], [1, [0, 5], 64, 1, 2, 0],
    [2, [4, 8, 10, 11], 192, 1, 2, 0], [2, [8, 9], 192, 4, 2, 0],
    [3, [12, 13], 256, 2, 2, 0],
]
ASN_EDGE_WEIGHTS = [
    [], [], [], [], [], [],
    [[0.13810564577579498, 0.8465337157249451, 0.3072969317436218,
      0.2867436408996582]],
    [[0.5846117734909058, 0.6066334843635559]],
    [[0.16382087767124176, 0.8852924704551697, 0.4039595425128937,
      0.6823437809944153, 0.5331538319587708]],
    [[0.028569204732775688, 0.10333596915006638, 0.7517264485359192,
      0.9260114431381226]],
    [[0.28832191228866577, 0.7627848982810974, 0.404977947473526]],
    [[0.23474831879138947, 0.7841425538063049]],
    [[0.27616503834724426, 0.9514784812927246, 0.6568767428398132,
      0.9547983407974243]],
    [[0.5047007203102112, 0.8876819610595703]],
    [[0.9892204403877258, 0.8454614877700806]],
]

# AssembleNet++-50 (Ryoo et al., ECCV 2020; found on Charades) with its
# object-segmentation stem (node 4, [-3, 4]) and learned edge weights
# (`full_asnp50_structure`, `full_asnp_structure_weights`).
FULL_ASNP50_STRUCTURE = [
    [-1, 2], [-1, 4], [-2, 2], [-2, 1], [-3, 4],
    [0, [0, 1, 2, 3, 4], 32, 1, 1, 0],
    [0, [0, 1, 4], 32, 4, 1, 0],
    [0, [2, 3, 4], 32, 8, 1, 0],
    [0, [2, 3, 4], 32, 1, 1, 0],
    [1, [0, 1, 2, 4, 5, 6, 7, 8], 64, 4, 2, 0],
    [1, [2, 3, 4, 7, 8], 64, 1, 2, 0],
    [1, [0, 4, 5, 6, 7], 128, 8, 2, 0],
    [2, [4, 11], 256, 8, 2, 0],
    [2, [2, 3, 4, 5, 6, 7, 8, 10, 11], 256, 4, 2, 0],
    [3, [12, 13], 512, 2, 2, 0],
]
FULL_ASNP_EDGE_WEIGHTS = [
    [], [], [], [], [],
    [[0.6143830418586731, 0.7111759185791016, 0.19351491332054138,
      0.1701001077890396, 0.7178536653518677]],
    [[0.5755624771118164, 0.5644599795341492, 0.7128658294677734]],
    [[0.26563042402267456, 0.3033692538738251, 0.8244096636772156]],
    [[0.07013848423957825, 0.07905343919992447, 0.8767927885055542]],
    [[0.5008697509765625, 0.5020178556442261, 0.49819135665893555,
      0.5015180706977844, 0.4987695813179016, 0.4990265369415283,
      0.499239057302475, 0.4974501430988312]],
    [[0.47034338116645813, 0.4694305658340454, 0.767791748046875,
      0.5539310574531555, 0.4520096182823181]],
    [[0.2769702076911926, 0.8116549253463745, 0.597356915473938,
      0.6585626602172852, 0.5915306210517883]],
    [[0.501274824142456, 0.5016682147979736]],
    [[0.0866393893957138, 0.08469288796186447, 0.9739039540290833,
      0.058271341025829315, 0.08397126197814941, 0.10285478830337524,
      0.18506969511508942, 0.23874442279338837, 0.9188644886016846]],
    [[0.4174623489379883, 0.5844835638999939]],
]

# AssembleNet / AssembleNet++ depth -> blocks per level (levels 0..3).
ASSEMBLENET_BLOCKS_PER_DEPTH = {
    26: (2, 2, 2, 2), 38: (2, 4, 4, 2), 50: (3, 4, 6, 3),
    68: (3, 4, 12, 3), 77: (3, 4, 15, 3), 101: (3, 4, 23, 3),
}
# AssembleNet's bottleneck width (the 3x3 convolution's channels) per level.
ASSEMBLENET_INTERMEDIATE_CHANNELS = (64, 128, 256, 512)


def assemblenet_blocks_per_level(model_id: Union[str, int]) -> Tuple[int, ...]:
  """The blocks per level of AssembleNet(++)-`model_id` (a depth).

  Raises:
    ValueError: an unknown depth, naming the known ones."""
  try:
    depth = int(model_id)
  except (TypeError, ValueError):
    depth = None
  if depth not in ASSEMBLENET_BLOCKS_PER_DEPTH:
    raise ValueError(f'model_id {model_id!r} is not an AssembleNet depth; '
                     f'known: {sorted(ASSEMBLENET_BLOCKS_PER_DEPTH)}.')
  return ASSEMBLENET_BLOCKS_PER_DEPTH[depth]


# A small structure with the same topology rules (two stems, every level,
# multi-input fusion with differing channel counts and spatial sizes), for
# tests and the CPU demo.
TINY_STRUCTURE = [
    [-1, 1], [-2, 1],
    [0, [0, 1], [8, 8, 8], 1, 2, 0],
    [0, [0, 1], [8, 8, 4], 2, 2, 0],
    [1, [0, 1, 2, 3], [16, 16, 8], 1, 2, 0],
    [2, [0, 2, 3, 4], [24, 24, 12], 2, 2, 0],
    [3, [3, 4, 5], [32, 32, 16], 1, 1, 0],
]
TINY_BLOCKS_PER_LEVEL = (1, 1, 1, 1)

# Small AssembleNet / AssembleNet++ structures (one int of filters a block
# node) for the CPU demos: RGB and flow stems, every level, multi-input
# fusions; the AssembleNet++ one adds an object stem (node 2) feeding levels
# 0 and 2.
TINY_ASN_STRUCTURE = [
    [-1, 1], [-2, 1],
    [0, [0, 1], 8, 1, 1, 0],
    [1, [0, 1, 2], 16, 2, 2, 0],
    [2, [2, 3], 16, 1, 2, 0],
    [3, [3, 4], 16, 1, 2, 0],
]
TINY_ASNP_STRUCTURE = [
    [-1, 1], [-2, 1], [-3, 1],
    [0, [0, 1, 2], 8, 1, 1, 0],
    [1, [0, 1, 3], 16, 2, 2, 0],
    [2, [2, 3, 4], 16, 1, 2, 0],
    [3, [4, 5], 16, 1, 2, 0],
]


StructureLike = Union[str, Sequence[Any]]


def _loads(value: Any, what: str) -> Any:
  if isinstance(value, str):
    try:
      return json.loads(value)
    except json.JSONDecodeError as e:
      raise ValueError(f'{what} is not valid JSON: {e}') from e
  return value


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def is_stem(node: Sequence[Any]) -> bool:
  return node[0] < 0


def validate_structure(structure: StructureLike,
                       edge_weights: Optional[StructureLike] = None,
                       blocks_per_level: Optional[Sequence[int]] = None,
                       int_filters: bool = False
                       ) -> List[List[Any]]:
  """Checks a structure (node list or JSON text), and optionally edge weights
  ('' / '[]' / None: learned) and `blocks_per_level` (4 positive ints);
  returns the structure as lists, block nodes cut to five entries. A block
  node's filters are 3 ints (AssembleNet++lite), or with `int_filters` one
  int (AssembleNet, AssembleNet++).

  Raises:
    ValueError: naming the offending node (`node i`) and what was expected."""
  structure = _loads(structure, 'model structure')
  if not isinstance(structure, (list, tuple)) or not structure:
    raise ValueError('model structure must be a non-empty list of nodes; got '
                     f'{structure!r}')
  if blocks_per_level is not None:
    if (len(blocks_per_level) != 4 or
        not all(_is_int(b) and b >= 1 for b in blocks_per_level)):
      raise ValueError('blocks_per_level must be 4 positive ints (levels 0-3); '
                       f'got {list(blocks_per_level)!r}')
  out = []
  for i, node in enumerate(structure):
    where = f'model structure node {i} ({node!r})'
    if not isinstance(node, (list, tuple)) or not node or not _is_int(node[0]):
      raise ValueError(f'{where}: expected [stem_type, temporal_dilation] or '
                       '[block_level, [inputs], [f, f, f], temporal_dilation, '
                       'spatial_stride].')
    if node[0] < 0:
      if node[0] not in STEM_TYPES or len(node) != 2 or not _is_int(node[1]):
        raise ValueError(f'{where}: a stem is [stem_type, temporal_dilation] '
                         'with stem_type -1 (RGB), -2 (flow) or -3 (object).')
      out.append([node[0], node[1]])
      continue
    if node[0] not in BLOCK_LEVELS:
      raise ValueError(f'{where}: block_level must be 0..3 (or a stem type '
                       f'-1/-2/-3); got {node[0]}.')
    if len(node) not in (5, 6):
      raise ValueError(f'{where}: a block node has 5 entries (a 6th, ignored, '
                       f'is allowed); got {len(node)}.')
    level, inputs, filters, dilation, stride = node[:5]
    if (not isinstance(inputs, (list, tuple)) or not inputs or
        not all(_is_int(j) for j in inputs)):
      raise ValueError(f'{where}: inputs must be a non-empty list of node '
                       f'indices; got {inputs!r}.')
    for j in inputs:
      if not 0 <= j < i:
        raise ValueError(f'{where}: input index {j} must be >= 0 and lower '
                         f'than the node\'s own index {i}.')
    if len(set(inputs)) != len(inputs):
      raise ValueError(f'{where}: inputs {inputs!r} repeat a node.')
    if int_filters:
      if not _is_int(filters) or filters < 1:
        raise ValueError(f'{where}: filters must be one positive int (the '
                         f'blocks end with 4 x filters channels); got '
                         f'{filters!r}.')
    elif (not isinstance(filters, (list, tuple)) or len(filters) != 3 or
          not all(_is_int(f) and f >= 1 for f in filters)):
      raise ValueError(f'{where}: filters must be 3 positive ints '
                       f'[f_expand, f_expand, f_out]; got {filters!r}.')
    if not _is_int(dilation) or dilation < 1:
      raise ValueError(f'{where}: temporal_dilation must be an int >= 1; got '
                       f'{dilation!r}.')
    if not _is_int(stride) or stride < 1:
      raise ValueError(f'{where}: spatial_stride must be an int >= 1; got '
                       f'{stride!r}.')
    out.append([level, list(inputs),
                filters if int_filters else list(filters), dilation, stride])
  if not any(n[0] < 0 for n in out):
    raise ValueError('model structure has no stem node ([-1, d] RGB or '
                     '[-2, d] flow).')
  if not any(n[0] == 3 for n in out):
    raise ValueError('model structure has no level-3 node: the head reads the '
                     'first level-3 node.')
  weights = normalize_edge_weights(edge_weights)
  if weights is not None:
    if len(weights) != len(out):
      raise ValueError(f'model edge weights have {len(weights)} entries; the '
                       f'structure has {len(out)} nodes (one entry per node).')
    for i, (node, w) in enumerate(zip(out, weights)):
      where = f'model edge weights of node {i}'
      n_in = 0 if node[0] < 0 else len(node[1])
      if n_in <= 1:
        if w not in ([], ()):
          raise ValueError(f'{where}: a stem or single-input node takes []; '
                           f'got {w!r}.')
        continue
      if (not isinstance(w, (list, tuple)) or len(w) != 1 or
          not isinstance(w[0], (list, tuple)) or len(w[0]) != n_in):
        raise ValueError(f'{where}: expected [[w_1, ..., w_{n_in}]] (one '
                         f'post-sigmoid weight per input); got {w!r}.')
      for x in w[0]:
        if not isinstance(x, (int, float)) or not 0.0 < float(x) < 1.0:
          raise ValueError(f'{where}: weights are post-sigmoid values in '
                           f'the open interval (0, 1); got {x!r}.')
  return out


def normalize_edge_weights(edge_weights: Optional[StructureLike]
                           ) -> Optional[List[Any]]:
  """None for "no weights given" ('' / '[]' / [] / None), else the list."""
  edge_weights = _loads(edge_weights, 'model edge weights') if edge_weights else None
  if edge_weights is None or (isinstance(edge_weights, (list, tuple)) and
                              len(edge_weights) == 0):
    return None
  if not isinstance(edge_weights, (list, tuple)):
    raise ValueError('model edge weights must be a list with one entry per '
                     f'node; got {edge_weights!r}')
  return [list(w) if isinstance(w, (list, tuple)) else w for w in edge_weights]


def min_num_frames(structure: StructureLike) -> int:
  """The fewest frames a clip may have: 2 with a flow stem (flow between
  consecutive frames), else 1 (every temporal stride is 1)."""
  structure = _loads(structure, 'model structure')
  return 2 if any(n[0] == STEM_FLOW for n in structure) else 1


def check_num_frames(structure: StructureLike, num_frames: int,
                     what: str, network: str = 'AssembleNet++lite') -> None:
  """ValueError naming `what` (a config key) unless a clip of `num_frames`
  frames fits `structure`."""
  least = min_num_frames(structure)
  if num_frames < least:
    structure = _loads(structure, 'model structure')
    flow = [i for i, n in enumerate(structure) if n[0] == STEM_FLOW]
    why = (f'the flow stem (node {flow[0]}) computes optical flow between '
           'consecutive frames' if flow else 'a clip needs a frame')
    raise ValueError(
        f'{what}: {num_frames} frames; {network} takes any frame '
        f'count >= {least} (all its temporal strides are 1; {why}).')


def nodes_below(structure: Sequence[Sequence[Any]], level: int) -> List[int]:
  """Indices of the nodes of a level below `level` (stems included), by level
  then index: the original's peer-attention candidates."""
  out = []
  for lv in range(-3, level):
    out.extend(i for i, n in enumerate(structure) if n[0] == lv)
  return out


def dense_search_structure(structure: StructureLike,
                           int_filters: bool = False) -> List[List[Any]]:
  """The connectivity-search space of `structure` (filters as
  `validate_structure`'s `int_filters`): the same nodes, every block taking
  every lower-level node as input (the one-shot search starts from an
  overly connected graph)."""
  nodes = validate_structure(structure, int_filters=int_filters)
  out = []
  for node in nodes:
    if is_stem(node):
      out.append(list(node))
    else:
      inputs = sorted(nodes_below(nodes, node[0]))
      out.append([node[0], inputs] + list(node[2:]))
  return out


# `TINY_STRUCTURE`'s nodes with every lower-level node as an input (19 edges
# instead of 15): the space `assemblenet_plus_lite_search_demo` searches.
TINY_SEARCH_STRUCTURE = dense_search_structure(TINY_STRUCTURE)


def _read_json_file(path: str, key: str) -> Any:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    with tf.io.gfile.GFile(path, 'r') as f:
      text = f.read()
  except (tf.errors.OpError, OSError) as e:
    raise ValueError(f'{key}={path!r}: cannot read the file: {e}') from e
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'{key}={path!r}: not valid JSON: {e}') from e


def from_config_fields(model_structure: StructureLike,
                       model_structure_path: str,
                       model_edge_weights: Optional[StructureLike],
                       model_edge_weights_path: str,
                       prefix: str = 'model.backbone.assemblenet_plus_lite.'
                       ) -> Tuple[StructureLike, Optional[StructureLike]]:
  """(structure, edge_weights) a backbone config names, each inline (JSON text
  or lists) or from its `*_path` JSON file, neither validated; edge weights
  None when learned. `prefix` names the keys in errors.

  Raises:
    ValueError: both inline and path given, or a file missing, unreadable or
      not JSON (naming the config key and the file)."""
  if model_structure_path:
    if model_structure:
      raise ValueError(
          f'{prefix}model_structure and {prefix}model_structure_path are '
          f'both set (path {model_structure_path!r}); give one: set '
          f"{prefix}model_structure to '' to read the structure from the "
          'file.')
    model_structure = _read_json_file(model_structure_path,
                                      prefix + 'model_structure_path')
  elif not model_structure:
    raise ValueError(f'{prefix}model_structure is empty and no '
                     f'{prefix}model_structure_path is given.')
  if model_edge_weights_path:
    if model_edge_weights:
      raise ValueError(
          f'{prefix}model_edge_weights and {prefix}model_edge_weights_path '
          f'are both set (path {model_edge_weights_path!r}); give one.')
    model_edge_weights = _read_json_file(model_edge_weights_path,
                                         prefix + 'model_edge_weights_path')
  return model_structure, (model_edge_weights or None)


BACKBONE_KEY = 'task.model.backbone.assemblenet_plus_lite.'

# The backbone types whose block nodes take one int of filters.
INT_FILTER_TYPES = ('assemblenet', 'assemblenet_plus')
# Each backbone type's network name, for messages.
NETWORK_NAMES = {'assemblenet_plus_lite': 'AssembleNet++lite',
                 'assemblenet': 'AssembleNet',
                 'assemblenet_plus': 'AssembleNet++'}


def backbone_key(backbone_type: str) -> str:
  """'task.model.backbone.<type>.': the config keys' prefix of a backbone
  type.

  Raises:
    ValueError: a type that is not one of `NETWORK_NAMES`."""
  if backbone_type not in NETWORK_NAMES:
    raise ValueError(f'task.model.backbone.type {backbone_type!r} is not an '
                     f'AssembleNet-family backbone; known: '
                     f'{sorted(NETWORK_NAMES)}.')
  return f'task.model.backbone.{backbone_type}.'


def from_backbone(backbone) -> Tuple[List[Any], Optional[List[Any]]]:
  """(structure, edge weights (None: learned)) of a `Backbone3D` one-of
  config of any of the three types, errors naming its own keys: what every
  reader of the structure (task, builders, derive_structure) takes."""
  return from_backbone_config(backbone.get(),
                              prefix=backbone_key(backbone.type))


def from_backbone_config(backbone_config, prefix: str = BACKBONE_KEY
                         ) -> Tuple[List[Any], Optional[List[Any]]]:
  """(structure, edge weights (None: learned)) of one backbone type's config
  (its fields `model_structure[_path]`, `model_edge_weights[_path]`), inline
  or from its files; `prefix` names its keys in errors (`from_backbone`
  derives it from the one-of config).

  Raises:
    ValueError: as `from_config_fields`, or text that is not JSON."""
  c = backbone_config
  structure, edge_weights = from_config_fields(
      c.model_structure, c.model_structure_path, c.model_edge_weights,
      c.model_edge_weights_path, prefix=prefix)
  return (_loads(structure, prefix + 'model_structure'),
          normalize_edge_weights(edge_weights))
