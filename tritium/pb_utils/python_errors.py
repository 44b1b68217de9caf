"""A Python error from model code as Triton's stub reports it (pybind11's format).

``<type>: <message>`` and the model's frames innermost first
(``\\n\\nAt:\\n  <file>(<line>): <function>\\n``): the caller's own frames are left out, and
so are pb_utils' (C++ in Triton, so without frames there).
"""

from __future__ import annotations

import importlib
import os
import traceback

from tritium.pb_utils import PACKAGE_DIR

# importlib.import_module's own frames: Triton's stub imports a model through the C API, which
# shows the import machinery's frames from _find_and_load in.
_IMPORT_MODULE = os.path.dirname(importlib.__file__)


def with_model_frames(exc: BaseException, callers: tuple[str, ...]) -> str:
    """``callers``: where the frames between the catch and the model's code come from (file
    names or their prefixes); they are dropped from the outer end."""
    frames = traceback.extract_tb(exc.__traceback__)
    outer = (*callers, PACKAGE_DIR, _IMPORT_MODULE)   # (pb_utils imports the model's file)
    while frames and (frames[0].filename.startswith(outer) or frames[0].name == "_gcd_import"):
        frames.pop(0)
    while frames and frames[-1].filename.startswith(PACKAGE_DIR):   # raised in pb_utils
        frames.pop()
    where = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc}" + (f"\n\nAt:\n{where}" if where else "")
