"""The smallest AssembleNet++lite network, for tests whose claim is not about
the architecture (training and evaluation plumbing, export, metrics).

Every kind of node the model takes is in it: the RGB stem, the flow stem, a
fusion of two inputs (edge weights learned unless given; with peer attention
the stems are its peers) and a strided level-3 block group (the output).
Building and tracing it (a training step under a 2-replica strategy, a
serving function) costs a fraction of the 7-node `TINY_STRUCTURE`, which
tests/assemblenet/test_modeling.py (shapes, parameter counts) and
test_recompute.py cover.
"""
import json

from official_ext.assemblenet import structures

STRUCTURE = [[-1, 1], [-2, 1], [3, [0, 1], [8, 8, 8], 1, 2]]
BLOCKS_PER_LEVEL = (1, 1, 1, 1)
structures.validate_structure(STRUCTURE, blocks_per_level=BLOCKS_PER_LEVEL)


def backbone(**overrides):
  """`task.model.backbone` overrides: the minimal network, learned edge
  weights, 8 stem filters, 2 flow iterations (then `overrides`)."""
  b = {'model_structure': json.dumps(STRUCTURE), 'model_edge_weights': '',
       'blocks_per_level': list(BLOCKS_PER_LEVEL), 'stem_filters': 8,
       'rep_flow': {'num_iter': 2}}
  b.update(overrides)
  return {'assemblenet_plus_lite': b}


# The smallest AssembleNet (RGB stem, one strided level-3 node) and
# AssembleNet++ with an object stem (RGB and object stems fused), one int of
# filters a node.
ASN_STRUCTURE = [[-1, 1], [3, [0], 4, 1, 2]]
ASNP_STRUCTURE = [[-1, 1], [-3, 1], [3, [0, 1], 4, 1, 2]]


def asn_backbone(structure, **overrides):
  """An `assemblenet` / `assemblenet_plus` backbone's overrides: `structure`,
  learned edge weights, one block a level, 8 stem filters (then
  `overrides`)."""
  b = {'model_structure': json.dumps(structure), 'model_edge_weights': '',
       'blocks_per_level': list(BLOCKS_PER_LEVEL), 'stem_filters': 8}
  b.update(overrides)
  return b
