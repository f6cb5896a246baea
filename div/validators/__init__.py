"""Record validators: the checks `div validate` runs after DIV on every record of a partition.

- ``div.validators.base`` — the interface: ``RecordValidator``, the ``Record`` and ``PartitionContext`` a
  validator sees, the ``Chain`` that runs them and ``ValidatorSpecError``;
- ``div.validators.builtin`` — the built-ins (Kafka's own log checks), configured as ``builtin:<name>``;
- ``div.validators.registry`` — from configuration (``module:Class``, ``builtin:<name>``) to a ``Chain``; the one
  module that knows both the interface and the built-ins.

The interface is re-exported here, so a validator of one's own imports it as
``from div.validators import PartitionContext, Record, RecordValidator`` (docs/validators.md).
"""

from div.validators.base import PartitionContext, Record, RecordValidator, ValidatorSpecError

__all__ = ["PartitionContext", "Record", "RecordValidator", "ValidatorSpecError"]
