"""A fault at an exact moment inside a real ``geosearch search`` process (tests only).

``tests/faults/_harness.py`` puts this folder first on ``PYTHONPATH`` of the command it
starts, so that Python imports it at startup in the command and in each of its
``--workers``. With ``GEOSEARCH_TEST_FAULT=NUMBER:PARAM:ACTION`` set, the process whose
trial ``NUMBER`` is about to store the parameter ``PARAM`` (after its earlier parameters
were stored) does ``ACTION``:

* ``kill``: SIGKILL itself;
* ``int``: SIGINT itself (Ctrl-C);
* ``parent-term``: SIGTERM its parent (the ``--workers`` command), then wait for what the
  parent forwards.

With ``GEOSEARCH_TEST_RACE=SECONDS`` set, the process's first ``enqueue_trial`` waits
``SECONDS`` first: two commands started together on one new study both read it empty
before either queues its grid (the race of two run directories on one shared storage).

Without the variables nothing is patched.
"""

import os

_FAULT = os.environ.get("GEOSEARCH_TEST_FAULT")

if _FAULT:
    import signal
    import time

    import optuna

    _number, _param, _action = _FAULT.split(":")
    _original = optuna.trial.Trial.suggest_categorical

    def _suggest_categorical(self, name, choices):
        if name == _param and self.number == int(_number):
            if _action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif _action == "int":
                os.kill(os.getpid(), signal.SIGINT)
            elif _action == "parent-term":
                os.kill(os.getppid(), signal.SIGTERM)
            time.sleep(30)  # the signal (or the one the parent forwards) lands here
        return _original(self, name, choices)

    optuna.trial.Trial.suggest_categorical = _suggest_categorical

_RACE = os.environ.get("GEOSEARCH_TEST_RACE")

if _RACE:
    import time

    import optuna

    _enqueue = optuna.Study.enqueue_trial
    _waited = []

    def _enqueue_trial(self, *args, **kwargs):
        if not _waited:
            _waited.append(True)
            time.sleep(float(_RACE))
        return _enqueue(self, *args, **kwargs)

    optuna.Study.enqueue_trial = _enqueue_trial
