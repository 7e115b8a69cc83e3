"""The shortest run found to 99% test accuracy on a 2-core CPU: one epoch.

The same CNN and batch size as configs/default.py; what changes is the
schedule: a one-cycle learning rate (warm-up to 0.15, then cosine decay to
near zero) with Nesterov momentum, which reaches in one epoch what the
constant rate reaches in about three, and no dropout (a regulariser that one
epoch does not need, and that costs a fifth of a CPU step in random bits).
"""

from configs import default


def get_config():
  """Returns the fast configuration (see the module docstring)."""
  config = default.get_config()
  config.num_epochs = 1
  config.learning_rate = 0.15  # The peak of the one-cycle schedule.
  config.lr_schedule = 'one_cycle'
  config.nesterov = True
  config.dropout_rate = 0.0
  return config
