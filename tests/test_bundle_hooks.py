"""The bundle's deferred run-time hooks (tools/pyinstaller/deferred_rthook.py), run here in
the plain interpreter: PyInstaller's hook runs once, when its module is first imported (or,
for inspect, at the first getsourcefile of a relative file name), never before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = (ROOT / "tools" / "pyinstaller" / "deferred_rthook.py").read_text(encoding="utf-8")


def run(module: str, trigger: str, stock: str, then: str) -> str:
    """A fresh interpreter: the hook for ``module`` (stock source ``stock``), then ``then``."""
    hook = f"_MODULE = {module!r}\n_TRIGGER = {trigger!r}\n_STOCK_NAME = 'stock.py'\n_STOCK_SOURCE = {stock!r}\n" + TEMPLATE
    code = f"{hook}\n{then}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_import_hook_runs_once_right_after_the_first_import() -> None:
    stock = "import sys, colorsys\nprint('hook ran, module there:', 'colorsys' in sys.modules, hasattr(colorsys, 'rgb_to_hsv'))\n"
    out = run("colorsys", "import", stock, (
        "import sys\n"
        "print('before:', 'colorsys' in sys.modules)\n"
        "import colorsys\n"
        "import colorsys as again\n"
        "print('loader:', type(colorsys.__loader__).__name__, type(colorsys.__spec__.loader).__name__)\n"
        "print('meta path clean:', not any(type(f).__name__ == 'AfterImport' for f in sys.meta_path))\n"
    ))
    assert out.splitlines() == [
        "before: False",
        "hook ran, module there: True True",
        "loader: SourceFileLoader SourceFileLoader",
        "meta path clean: True",
    ]


def test_a_module_that_does_not_exist_still_fails_to_import() -> None:
    out = run("no_such_module_here", "import", "print('must not run')\n", (
        "try:\n    import no_such_module_here\nexcept ImportError as exc:\n    print('ImportError', exc.name)\n"
    ))
    assert out.splitlines() == ["ImportError no_such_module_here"]


def test_the_inspect_hook_waits_for_a_relative_file_name() -> None:
    stock = (
        "import inspect\n"
        "print('hook ran')\n"
        "_original = inspect.getsourcefile\n"
        "inspect.getsourcefile = lambda obj: 'resolved:' + str(_original(obj))\n"
    )
    out = run("inspect", "getsourcefile", stock, (
        "import inspect, json, types\n"
        "print('absolute:', inspect.getsourcefile(json) == json.__file__)\n"
        "code = compile('x = 1', 'relative.py', 'exec')\n"
        "print(inspect.getsourcefile(code))\n"
        "print(inspect.getsourcefile(code))\n"
    ))
    assert out.splitlines() == ["absolute: True", "hook ran", "resolved:None", "resolved:None"]
