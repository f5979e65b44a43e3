"""Stand-in: defines the model flags, as the original's run_asn.py does."""
from absl import flags

from assemblenet import rep_flow_2d_layer  # pylint: disable=unused-import

flags.DEFINE_integer('num_frames', 64, 'Number of frames to use.')
flags.DEFINE_integer('num_classes', 157, 'Number of classes.')
flags.DEFINE_string('model_structure', '[-1,1]', 'structure')
flags.DEFINE_string('model_edge_weights', '[]', 'edge weights')
flags.DEFINE_string('attention_mode', None, '"peer" or "self" or None')
