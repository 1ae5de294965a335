"""Started by the sitecustomize of ``tidemark run``: starts the agent and instruments PyTorch
as soon as the script imports it (torch is not imported here, so start-up stays fast)."""
import importlib.abc
import os
import sys


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Runs the adapter's installation right after ``torch`` has been imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_instrument(module):
            exec_module(module)
            try:
                from .adapter import instance
                instance().install()
            except Exception as exc:  # never break the user's import of torch
                sys.stderr.write("tidemark: could not instrument torch: %r\n" % (exc,))

        loader.exec_module = exec_and_instrument
        return spec


def start(adapter=True):
    from .adapter import instance
    inst = instance()
    if not inst.agent.present:
        return  # a child interpreter without the agent: nothing to do
    if not inst.agent.start():
        return  # not recorded: a launcher passing the agent on to its ranks (torchrun)
    if not adapter:
        return  # `tidemark run --no-adapter`: allocations only
    if "torch" in sys.modules:
        inst.install()
    else:
        sys.meta_path.insert(0, _TorchWatcher())


if os.environ.get("TIDEMARK_AUTOSTART") in ("1", "agent"):
    start(adapter=os.environ.get("TIDEMARK_AUTOSTART") == "1")
