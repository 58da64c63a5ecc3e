"""Records, in seqflow/_paths.py, where this source checkout's libseqflow.so is built, so that
an installed package finds the build tree it came from (SEQFLOW_LIB and pkg-config come
first and last: seqflow/_lib.py). Everything else is in pyproject.toml."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPy(build_py):
    def run(self):
        super().run()
        dirs = []
        build = os.environ.get("SEQFLOW_BUILD_DIR") or os.path.join(HERE, "..", "build")
        if os.path.exists(os.path.join(build, "libseqflow.so")):
            dirs.append(os.path.realpath(build))
        target = os.path.join(self.build_lib, "seqflow", "_paths.py")
        with open(target, "w") as f:
            f.write('"""Written at install time by setup.py: build trees holding libseqflow.so."""\n')
            f.write(f"BUILD_DIRS = {dirs!r}\n")


setup(cmdclass={"build_py": BuildPy})
