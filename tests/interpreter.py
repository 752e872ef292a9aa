"""Triton's interpreter (``TRITON_INTERPRET=1``) as the kernel tests run it on the CPU.

The interpreter holds a kernel's scalars as one-element NumPy arrays and turns one into a Python
integer with ``int(array)``, which NumPy 2.4 refuses for arrays that are not 0-dimensional; a
kernel loop whose trip count is computed at run time (``range(0, n)``, what the compiler
pipelines on a GPU) then fails under the interpreter only. :func:`patch_index` reads the one
element instead. Call it in the interpreted process before the first kernel runs.
"""

from __future__ import annotations


def patch_index() -> None:
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
