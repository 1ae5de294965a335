"""Imported by Python at start-up under ``tidemark run`` (this folder is put on PYTHONPATH).
Starts the tidemark adapter, then hands over to any other sitecustomize on the path."""
import importlib.util
import os
import sys

try:
    import tidemark.autostart  # noqa: F401  (starts the agent and watches for torch)
except Exception as exc:  # never break the user's interpreter
    sys.stderr.write("tidemark: adapter not started: %r\n" % (exc,))

# Chain to the next sitecustomize, if the environment had one.
_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    if os.path.abspath(_entry or ".") == _here:
        continue
    _candidate = os.path.join(_entry or ".", "sitecustomize.py")
    if os.path.isfile(_candidate):
        _spec = importlib.util.spec_from_file_location("_tidemark_next_sitecustomize", _candidate)
        if _spec and _spec.loader:
            _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break
