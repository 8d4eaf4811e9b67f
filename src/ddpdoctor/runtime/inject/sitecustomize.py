"""ddpdoctor's injection point, put first on PYTHONPATH by ``ddpdoctor run``.

Python imports ``sitecustomize`` at start-up in every process of the job, torchrun's workers
and ``mp.spawn`` children alike. This one starts the ddpdoctor runtime, then runs the
``sitecustomize`` it shadows, if the user has one.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _ddpdoctor_start() -> None:
    try:
        from ddpdoctor.runtime import bootstrap

        bootstrap.boot()
    except Exception as exc:  # the job must run even if ddpdoctor cannot
        sys.stderr.write(f"ddpdoctor: instrumentation not started ({type(exc).__name__}: "
                         f"{exc}); the job runs without it\n")


def _chain_user_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_ddpdoctor_start()
_chain_user_sitecustomize()
