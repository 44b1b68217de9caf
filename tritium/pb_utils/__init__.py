"""Home of ``triton_python_backend_utils``, the module Triton's Python models import.

This folder is put on ``sys.path`` of the processes that run user ``model.py`` code
(the Python backend's instances and the auto-complete subprocess), so that
``import triton_python_backend_utils as pb_utils`` works unchanged.
"""

from pathlib import Path

PACKAGE_DIR = str(Path(__file__).resolve().parent)
MODULE_DIR = str(Path(PACKAGE_DIR) / "triton_names")   # on the models' sys.path
