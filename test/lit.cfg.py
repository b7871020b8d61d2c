# lit configuration of the ernie compiler tests.

import os
import sys

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "ernie"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.ernie_obj_root, "test")
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "Unit", "Inputs"]

# Captured names must be re-captured after each CHECK-LABEL.
config.environment["FILECHECK_OPTS"] = "-enable-var-scope --allow-unused-prefixes=false"

config.substitutions.append(("%ernie_src_root", config.ernie_src_root))
# %allclose A B [--rtol R]: two .npy files equal within rounding (numpy).
config.substitutions.append(
    ("%allclose", f"{config.python_executable or sys.executable} "
                  f"{config.test_source_root}/Inputs/allclose.py"))
# %python: the interpreter the build found (with numpy), to write inputs.
config.substitutions.append(("%python", config.python_executable or sys.executable))

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)

tool_dirs = [config.ernie_tools_dir, config.llvm_tools_dir]
tools = ["ernie-opt", "ernie-translate", "ernie-run", "ernie-ckpt", "mlir-opt"]
llvm_config.add_tool_substitutions(tools, tool_dirs)
