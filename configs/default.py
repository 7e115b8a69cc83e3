"""Default hyperparameters: those of the Flax MNIST example.

SGD with momentum (learning rate 0.1, momentum 0.9), batch 128, 10 epochs,
dropout 0.025. Each field's meaning, default and allowed values, and whether
a resumed run may change it, are in `FIELDS` of config_fields.py, where a
new field is added.
"""

from run import config_fields
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the default configuration: every field at its default."""
  return config_fields.defaults()
