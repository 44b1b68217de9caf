"""The modules a Python model imports by the names Triton gives them (``triton_python_backend_utils``,
``c_python_backend_utils``): this folder alone is put on the model's ``sys.path``, so that no
other module of tritium's can hide one of the model's own (a ``metrics.py`` beside its model.py)."""
