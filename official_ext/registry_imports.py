"""Imports every official_ext family so its experiments and tasks register,
and has AutoGraph leave the package's functions as written
(docs/architecture.md#autograph)."""
# pylint: disable=unused-import
from official_ext.core import tf_internals
from official_ext.yt8m import configs as yt8m_configs
from official_ext.yt8m import task as yt8m_task
from official_ext.readout import task as readout_task
from official_ext.assemblenet import task as assemblenet_task
from official_ext.joint import configs as joint_configs
from official_ext.joint import task as joint_task

tf_internals.exclude_from_autograph()
