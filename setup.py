"""Build script: the metadata lives in setup.cfg.

The one addition here puts ``tmpatch.pth`` (source: tmpatch/bootstrap/tmpatch.pth)
at the root of the wheel, so that it lands in site-packages both for a regular
install and for a PEP 660 editable one (whose wheel otherwise holds only the
path hook). tools/install_check.sh checks both for real.
"""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "tmpatch.pth"
PTH_SOURCE = os.path.join("tmpatch", "bootstrap", PTH)


class build_py_with_pth(build_py):
    """``build_py`` that also writes ``tmpatch.pth`` at the wheel's root."""

    def run(self):
        super().run()
        for directory in self._pth_directories():
            self.mkpath(directory)
            self.copy_file(PTH_SOURCE, os.path.join(directory, PTH), preserve_mode=False)

    def _pth_directories(self):
        if not getattr(self, "editable_mode", False):
            return [self.build_lib]  # bdist_wheel zips build_lib as the wheel's root
        # editable_wheel ignores build_lib and zips the directory it configured as
        # the install command's install_lib (the unpacked editable wheel)
        return [self.get_finalized_command("install").install_lib]

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, PTH))
        return outputs


setup(cmdclass={"build_py": build_py_with_pth})
