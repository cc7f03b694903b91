"""``python -m mpicoll`` is ``python -m mpicoll.run``."""
from .run import entry

entry()
