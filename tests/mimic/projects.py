"""The files of the mimic images: tiny projects of ours laid out the way each real image family is.

* OFFICIAL: a SWE-bench instance image. `/opt/miniconda3/bin/activate` defines `conda activate testbed`,
  which puts `/opt/miniconda3/envs/testbed/bin` first on PATH; `python` and `pytest` exist only there (the
  system's pytest is removed), so nothing grades unless the eval script really activates the environment.
  The env's `python -m pip install ...` prints ~2 MB, as a verbose install does. /testbed holds `textkit`
  with a django-style runner (`./tests/runtests.py --verbosity 2 ...`, django's output format) and
  pytest tests.
* R2E_NATIVE: an R2E-Gym image: /testbed with an untracked `run_tests.sh` and `install.sh`, a tracked
  `setup.cfg` the install modified, a `.venv` whose python is the system's, and the hidden tests at
  `/r2e_tests`.
"""

from __future__ import annotations

import textwrap


def _d(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


ACTIVATE = _d(
    """
    # mimic of conda's activate script: `conda activate ENV` puts the env's bin first on PATH
    conda() {
      if [ "${1:-}" = "activate" ]; then
        export CONDA_DEFAULT_ENV="$2"
        export PATH="/opt/miniconda3/envs/$2/bin:$PATH"
        return 0
      fi
      echo "mimic conda: only 'activate' is supported" >&2
      return 1
    }
    """
)
ENV_PYTHON = _d(
    """
    #!/bin/sh
    # the testbed env's interpreter; `python -m pip ...` stands in for a verbose install (~2 MB of output)
    if [ "${1:-}" = "-m" ] && [ "${2:-}" = "pip" ]; then
      line='"  Building wheel for dependency-%05d (setup.py): finished with status done" % i'
      exec /usr/bin/python3 -c "for i in range(30000): print($line)"
    fi
    exec /usr/bin/python3 "$@"
    """
)
ENV_PYTEST = '#!/bin/sh\nexec python -m pytest "$@"\n'

TEXTKIT_TEXT = _d(
    """
    def truncate_words(text, count):
        words = text.split()
        return " ".join(words[:count - 1])


    def upper(text):
        return text.upper()


    def slugify(text):
        return "-".join(text.lower().split(" "))
    """
)
RUNTESTS = _d(
    '''
    #!/usr/bin/env python
    """A django-style runner: ./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 LABEL..."""
    import argparse
    import os
    import sys
    import unittest

    HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [HERE, os.path.dirname(HERE)]


    class DjangoStyleResult(unittest.TestResult):
        def _say(self, test, word):
            cls = type(test)
            print("%s (%s.%s) ... %s" % (test._testMethodName, cls.__module__, cls.__qualname__, word), flush=True)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._say(test, "ok")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._say(test, "FAIL")

        def addError(self, test, err):
            super().addError(test, err)
            self._say(test, "ERROR")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._say(test, "skipped %r" % reason)


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("labels", nargs="*")
        parser.add_argument("--verbosity", type=int, default=1)
        parser.add_argument("--settings")
        parser.add_argument("--parallel", type=int, default=1)
        args = parser.parse_args()
        suite = unittest.defaultTestLoader.loadTestsFromNames(args.labels)
        result = DjangoStyleResult()
        suite.run(result)
        print("Ran %d tests" % result.testsRun)
        bad = len(result.failures) + len(result.errors)
        print("FAILED (failures=%d)" % bad if bad else "OK")
        return 1 if bad else 0


    if __name__ == "__main__":
        sys.exit(main())
    '''
)
TEST_TEXT = _d(
    """
    import unittest

    from textkit.text import upper


    class TextTests(unittest.TestCase):
        def test_upper(self):
            self.assertEqual(upper("ab"), "AB")
    """
)
TEST_SLUG = "from textkit.text import slugify\n\n\ndef test_slug_lowercases():\n    assert slugify('A') == 'a'\n"

OFFICIAL_FILES = {
    "opt/miniconda3/bin/activate": ACTIVATE,
    "opt/miniconda3/envs/testbed/bin/python": ENV_PYTHON,
    "opt/miniconda3/envs/testbed/bin/pytest": ENV_PYTEST,
    "testbed/setup.py": "from setuptools import setup\n\nsetup(name='textkit', packages=['textkit'])\n",
    "testbed/textkit/__init__.py": "",
    "testbed/textkit/text.py": TEXTKIT_TEXT,
    "testbed/tests/runtests.py": RUNTESTS,
    "testbed/tests/utils_tests/__init__.py": "",
    "testbed/tests/utils_tests/test_text.py": TEST_TEXT,
    "testbed/tests/test_slug.py": TEST_SLUG,
}
OFFICIAL_SETUP = [
    "chmod +x /opt/miniconda3/envs/testbed/bin/* /testbed/tests/runtests.py",
    "rm -f /usr/bin/pytest /usr/bin/pytest-3 /usr/bin/py.test /usr/bin/py.test-3",
]

R2E_OPS = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n\n\ndef neg(a):\n    return a\n"
R2E_TESTS = _d(
    """
    from calcpkg.ops import add, mul, neg


    class TestOps:
        def test_add(self):
            assert add(2, 3) == 5

        def test_mul(self):
            assert mul(2, 3) == 6


    def test_neg_is_still_broken_upstream():
        assert neg(2) == -2
    """
)
R2E_NATIVE_FILES = {
    "testbed/calcpkg/__init__.py": "",
    "testbed/calcpkg/ops.py": R2E_OPS,
    "testbed/setup.cfg": "[metadata]\nname = calcpkg\n",
    "r2e_tests/__init__.py": "",
    "r2e_tests/test_ops.py": R2E_TESTS,
}
# run after the commit, as R2E's build does: the install leaves its scripts untracked and edits setup.cfg
R2E_NATIVE_SETUP = [
    "mkdir -p /testbed/.venv/bin && ln -s /usr/bin/python3 /testbed/.venv/bin/python",
    "printf '#!/bin/bash\\necho installing calcpkg\\n' > /testbed/install.sh",
    "printf '[options]\\npackages = calcpkg\\n' >> /testbed/setup.cfg",
    "printf '.venv/bin/python -W ignore -m pytest -rA r2e_tests\\n' > /testbed/run_tests.sh",
]
R2E_EXPECTED = {
    "TestOps.test_add": "PASSED",
    "TestOps.test_mul": "PASSED",
    "test_neg_is_still_broken_upstream": "FAILED",
}
