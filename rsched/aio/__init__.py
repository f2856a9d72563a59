"""asyncio client: ``from rsched.aio import Rsched`` (see :mod:`rsched.aio.client`)."""

from rsched.aio.client import Rsched

__all__ = ["Rsched"]
