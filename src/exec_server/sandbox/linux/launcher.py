"""Entry script of the Landlock launcher (``python -I -S launcher.py FLAGS -- CMD...``).

Deliberately tiny: a script is compiled on every run while imported modules
come from the bytecode cache, so the body lives in ``_launch.py``. ``-I``
keeps this directory off ``sys.path``; registering bare package modules makes
``exec_server.sandbox.linux.*`` importable without running package
``__init__``s (SANDBOX.md §3.6: start-up is the cost floor).
"""

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
