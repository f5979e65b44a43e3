"""Stand-in: `assemblenet_plus_lite` returns a model function of the original's
signature (clips [B, T, H, W, 3], is_training) -> logits, a tiny TF1 network
(one Conv3D per block level, batch norm, global pooling, a dense layer)."""
import json

from absl import flags
import tensorflow.compat.v1 as tf

FLAGS = flags.FLAGS


def assemblenet_plus_lite(num_layers, num_classes=339,
                          data_format='channels_last'):
  if data_format != 'channels_last':
    raise ValueError(data_format)
  structure = json.loads(FLAGS.model_structure)
  if FLAGS.attention_mode != 'peer' or not structure:
    raise ValueError('the stand-in expects the lite flags as run_asn sets them')

  def model(inputs, is_training):
    if inputs.shape[1] != FLAGS.num_frames:
      raise ValueError('num_frames flag and clip disagree')
    x = inputs
    for level, blocks in enumerate(num_layers):
      for _ in range(blocks):
        x = tf.layers.conv3d(x, 4 * (level + 1), 3, padding='same',
                             use_bias=False)
        x = tf.layers.batch_normalization(x, momentum=FLAGS.bn_decay,
                                          epsilon=FLAGS.bn_epsilon,
                                          training=is_training)
        x = tf.nn.relu(x)
    x = tf.reduce_mean(x, [1, 2, 3])
    return tf.layers.dense(x, num_classes)

  return model
