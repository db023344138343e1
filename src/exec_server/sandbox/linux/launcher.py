"""Landlock launcher entry (``python -I -S launcher.py FLAGS -- CMD...``): tiny, as a script is
compiled every run; bare package modules skip the package ``__init__``s (SANDBOX.md §3.6)."""

import os
import sys


def _bootstrap_package() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    module_type = type(sys)
    for name, path in (("exec_server", os.path.dirname(os.path.dirname(here))),
                       ("exec_server.sandbox", os.path.dirname(here)),
                       ("exec_server.sandbox.linux", here)):
        if name not in sys.modules:
            mod = module_type(name)
            mod.__path__ = [path]
            sys.modules[name] = mod


if __name__ == "__main__":
    _bootstrap_package()
    from exec_server.sandbox.linux._launch import main

    sys.exit(main(sys.argv[1:]))
