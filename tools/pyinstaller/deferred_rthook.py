# Template of a run-time hook of the bundle: tools/pyinstaller/chat-sidecar.spec writes one
# hook per deferred module, this text preceded by _MODULE, _TRIGGER, _STOCK_NAME and
# _STOCK_SOURCE (the module, when to run, and PyInstaller's hook for it).
#
# PyInstaller's own run-time hooks for `inspect`, `multiprocessing` and `pkgutil` run at
# every start, before the sidecar's first line: they import multiprocessing (and pickle,
# socket, subprocess), pkgutil, and zipfile (to read the names in base_library.zip), which
# the first answers never need; together that was most of the bundle's extra start time.
# This hook runs the same code, unchanged (PyInstaller's source, embedded at build time), at
# the moment it can first matter instead:
#   "import": right after MODULE is first imported (a meta path entry that removes itself);
#   "getsourcefile": at the first call of inspect.getsourcefile for an object whose file
#   name is relative (a code object's co_filename: the one case PyInstaller's inspect hook
#   exists for; anyio's lazy importer asks for absolute module files at every start, which
#   the original function answers as the hook would), armed when inspect is imported.
# What must stay true: the stock hook runs at most once, before any code can observe
# MODULE without it; an import of MODULE that fails is not swallowed.


def _pyi_deferred_rthook():
    import sys

    def run_stock_hook():
        code = compile(_STOCK_SOURCE, _STOCK_NAME, "exec")
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})

    def on_import(module):
        if _TRIGGER == "import":
            run_stock_hook()
            return
        original = module.getsourcefile
        isabs = sys.modules["os"].path.isabs

        def getsourcefile(object):
            if isabs(module.getfile(object)):
                return original(object)
            module.getsourcefile = original  # the stock hook wraps the original
            run_stock_hook()
            return module.getsourcefile(object)

        module.getsourcefile = getsourcefile

    if _MODULE in sys.modules:
        on_import(sys.modules[_MODULE])
        return

    class Loader:
        def __init__(self, loader):
            self.loader = loader

        def create_module(self, spec):
            return self.loader.create_module(spec)

        def exec_module(self, module):
            # the module sees its real loader (resources, get_source) from its first line
            module.__loader__ = self.loader
            if module.__spec__ is not None:
                module.__spec__.loader = self.loader
            self.loader.exec_module(module)
            on_import(module)

    class AfterImport:
        def find_spec(self, fullname, path=None, target=None):
            if fullname != _MODULE:
                return None
            sys.meta_path.remove(self)
            from importlib.util import find_spec

            spec = find_spec(fullname)
            if spec is not None and spec.loader is not None:
                spec.loader = Loader(spec.loader)
            return spec

    sys.meta_path.insert(0, AfterImport())


_pyi_deferred_rthook()
del _pyi_deferred_rthook
