"""What a retrying client decided, read from its log: the wait before each retry. A test checks the waits a
retry policy chose instead of timing the calls, which a loaded machine stretches."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

RETRY = re.compile(r"retry (\d+) in (\d+\.\d+)s")
"""The line every retrying client logs before it waits (`vistarl.clients.http`, the SGLang engine)."""


def retry_waits(records: Iterable[logging.LogRecord]) -> list[float]:
    """The seconds waited before each retry that `records` log, in order."""
    return [float(found[2]) for record in records if (found := RETRY.search(record.getMessage()))]
