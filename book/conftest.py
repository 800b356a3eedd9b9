"""The test command runs the chapters on another numeric path than the website build.

PyTorch computes its elementwise, reduction and softmax kernels with the widest instruction set the
CPU has (AVX-512, AVX2, ...), so a trained model's numbers differ in their last digits from one
machine to the next, and a claim that holds on one kernel path only fails on a reader's machine.
The website build executes every chapter with the CPU's own kernels; under pytest, nbval starts
each chapter's kernel with ``ATEN_CPU_CAPABILITY=default``, the portable kernels every CPU has.
A claim tied to one path then fails CI wherever CI runs. Set ``ATEN_CPU_CAPABILITY`` yourself to
run the chapters on another path; ``tools/portability.py`` runs a whole matrix of them.
"""

import os

import pytest

KERNELS_ENV = "ATEN_CPU_CAPABILITY"
CHAPTER_KERNELS = "default"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Start a chapter's kernel (nbval does it when the chapter's first cell is set up) on the portable kernels."""
    if item.path.suffix != ".ipynb" or KERNELS_ENV in os.environ:
        yield
        return
    os.environ[KERNELS_ENV] = CHAPTER_KERNELS
    try:
        yield
    finally:
        del os.environ[KERNELS_ENV]  # the kernel has started; nothing else sees the variable
