# setuptools reads `cffi_modules` only from setup(); everything else lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["app/colibri/_build_ffi.py:ffibuilder"])
