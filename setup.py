"""official_ext: YouTube-8M, AssembleNet++lite and multitask readout on TF Model Garden."""
import setuptools

# official_ext.readout.nwb (scripts/nwb_to_readout.py): Neurodata Without
# Borders files in (the version its tests ran with).
NWB = ["pynwb~=4.2.0"]
# official_ext.assemblenet.beam_pipelines: Apache Beam (the version its tests
# ran with; `tfrecord` adds the CRC library WriteToTFRecord needs). It caps
# protobuf below 7 (TensorFlow 2.20 takes >= 5.28), pyarrow below 26 and
# pillow below 13: installed beside TensorFlow it settles those versions.
BEAM = ["apache-beam[tfrecord]~=2.77.0"]

setuptools.setup(
    name="official_ext",
    version="0.1.0",
    description=(
        "TF2 Model Garden extension: YouTube-8M video classification, "
        "AssembleNet++lite and multitask readout tasks."
    ),
    packages=setuptools.find_packages(include=["official_ext", "official_ext.*"]),
    python_requires=">=3.11,<3.12",
    install_requires=[
        "tensorflow~=2.20.0",
        "tf-keras~=2.20.0",
        "tf-models-official==2.20.0",
        "ai-edge-litert~=2.3.0",  # LiteRT interpreter: official_ext.export_tflite
        "tensorflow-datasets",
        "gin-config",
        "absl-py",
        "numpy",
        "pyyaml",
        "importlib_resources",  # tensorflow-datasets needs it to prepare builders
        "opencv-python-headless",  # scripts/assemblenet_videos_to_tfrecord.py
        "matplotlib",  # official_ext.assemblenet.derive_structure --png
    ],
    extras_require={
        "nwb": NWB,
        "beam": BEAM,
        # scikit-learn: readout metric tests; NWB: the NWB converter's tests;
        # BEAM: the Beam pipelines' tests; jax (its CPU wheel): the tests of
        # scripts/run_xla_steps.py, which runs the exported XLA steps.
        "test": ["pytest", "pytest-xdist", "scikit-learn", "jax~=0.10.2"]
        + NWB + BEAM,
    },
)
