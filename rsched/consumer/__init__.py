"""`rsched run consumer`: claim due tasks of some queues and run their handlers."""

from rsched.consumer.loop import Consumer

__all__ = ["Consumer"]
